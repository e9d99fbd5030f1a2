"""Discrete-event simulation of a cluster: a clock that jumps and an executor that models progress.

Plugged into ``allocator.loop.run_loop``, they make a simulator out of the same loop a real
cluster runs.
"""

from allocator.simulator.clock import SimClock
from allocator.simulator.executor import RescaleCost, SimExecutor
from allocator.simulator.run import simulate

__all__ = ["RescaleCost", "SimClock", "SimExecutor", "simulate"]
