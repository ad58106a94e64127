"""mappa_agents: policies, multiagent systems and the batched rollout runner."""
