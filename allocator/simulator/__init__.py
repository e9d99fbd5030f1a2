"""Discrete-event simulation of a cluster: a clock that jumps and an executor that models progress.

Plugged into ``allocator.loop.run_loop``, they make a simulator out of the same loop a real
cluster runs.
"""

from allocator.simulator.clock import SimClock
from allocator.simulator.executor import RescaleCost, SimExecutor
from allocator.simulator.run import Physics, physics_of, simulate

__all__ = ["Physics", "RescaleCost", "SimClock", "SimExecutor", "physics_of", "simulate"]
