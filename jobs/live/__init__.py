"""The live read models: what live pages load and what patches them.

* :mod:`jobs.live.snapshots`: the whole view of a tenant's jobs or of one job, loaded
  on open and after every reconnect;
* :mod:`jobs.live.patches`: the fields a job's events carry for its page and the
  cluster view;
* :mod:`jobs.live.summary`: a tenant dashboard's counts, queue and JCT, sent once per
  transaction at commit.
"""
