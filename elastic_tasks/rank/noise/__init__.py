"""The gradient-noise probe: the online noise scale from the gradients a step already computes
(``scale.py``), how often it samples a step, and device scalars read a step later.
"""
