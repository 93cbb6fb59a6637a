"""Pure-Python scheduling core: snapshots, policies, throughput model, simulator.

Never imports Django, Celery, Channels or torch.
"""
