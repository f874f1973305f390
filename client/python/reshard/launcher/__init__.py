"""`reshard run`: the per-host launcher of a job's training ranks.
"""
