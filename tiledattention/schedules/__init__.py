"""How the kernel is tiled for a call: the schedule, its search space, the tuning table
and the policy that picks one per shape bucket."""
