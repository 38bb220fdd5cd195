"""Rollout: the JetStream-style slot engine (engine.py), the instances that drive it
(instance.py) and the plain records they exchange with the coordinator (messages.py).

Nothing is imported here, so `asyncrl.rollout.messages` can be used without loading JAX.
"""
