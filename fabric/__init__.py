"""Pure-Python leaf-spine fabric core: topology, routing, traffic, vClos allocation.

Never imports Django, Celery, Channels or torch.
"""
