"""Pipeline schedules as data: generators, a static validator, a simulator and closed forms.

    from shardwise.schedules import build, validate, simulate, Costs, p2p_plan
    s = validate(build("1f1b", p=4, m=8))
    sim = simulate(s, Costs(f=1, b=1, w=1, c=0.1))   # sim.makespan, sim.bubble_fraction, sim.events
    for step in p2p_plan(s)[rank]: ...               # recv before, action, send after
"""

from shardwise.schedules.generators import build
from shardwise.schedules.schedule import (Action, Dep, Schedule, Step, Transfer, dependencies, next_rank,
                                          p2p_plan, prev_rank, stage_owner, virtual_stage)
from shardwise.schedules.simulate import MAX_SIMULATED, Costs, Simulation, action_count, model_costs, simulate
from shardwise.schedules.validate import InvalidSchedule, problems, resolve, validate

__all__ = ["build", "Action", "Dep", "Schedule", "Step", "Transfer", "dependencies", "next_rank",
           "p2p_plan", "prev_rank", "stage_owner", "virtual_stage", "Costs", "Simulation", "model_costs", "simulate", "MAX_SIMULATED", "action_count",
           "InvalidSchedule", "problems", "resolve", "validate"]
