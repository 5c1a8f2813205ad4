"""Pipeline schedules as data: generators, a static validator, a simulator and closed forms."""
