"""portalctl: the portal's command-line client and Python client (no Django needed).

::

    from portalctl import Client

    client = Client("http://127.0.0.1:8000", token)
    bundle = client.code.upload("examples/torchrun-ddp")
    job = client.jobs.submit(name="ddp", code=bundle.id, entrypoint="train.py", gpus=2)
    for line in client.jobs.logs(job.id, follow=True):
        ...
"""

from portalctl.client import Client, PortalError

__all__ = ["Client", "PortalError"]
