"""Training on Ray: the modules that need the ``distributed`` extra (Ray, FSDP2 ranks).

- :mod:`~mappa_train.ray.trainer`: :func:`~mappa_train.ray.trainer.RayTrainer` and the
  names it is made of.
- :mod:`~mappa_train.ray.backend`: the backend that builds every agent's learner group.
- :mod:`~mappa_train.ray.learner` and :mod:`~mappa_train.ray.group`: an agent's learner
  and the driver's handle of its ranks; :mod:`~mappa_train.ray.learner_rank`: one rank.
- :mod:`~mappa_train.ray.rollout_engines`, :mod:`~mappa_train.ray.placement`: engine
  actors and where actors go.
- :mod:`~mappa_train.ray.sync_modes`, :mod:`~mappa_train.ray.weight_sync`: how new weights
  reach the engines.
- :mod:`~mappa_train.ray.support`: the import of Ray with its install hint.

This package imports nothing itself (a learner rank's process imports only what it runs),
and every import of Ray is absolute, so the name shadows nothing.
"""
