"""The shells app: ``portalctl shell`` into a running job's sandbox, through the portal and the agent."""
