"""A job's output: stored in order and capped (:mod:`jobs.logs.store`), exported whole into
the artifact store when the job ends (:mod:`jobs.logs.export`)."""
