"""Self-healing: move the jobs off a device at risk (or gone), isolate it, fail over, notify.

Plain functions, one concept per module; the `remediate` flow (flows/remediate.py) is the
DAG that strings them together, and tests call them without Prefect:

* ``devices``   - which device an event or an operator means, and which jobs run on it;
* ``ledger``    - incidents and their timelines, in the inventory's database (idempotency);
* ``launch``    - how a job is (re)started: its launch record and an in-process runner;
* ``steps``     - checkpoint, isolate, fail over, migrate, and the rollbacks;
* ``plan``      - what the flow decides at each turn, from what it sees (no I/O);
* ``notify``    - the operators' summary through a Prefect notification block;
* ``alarm_stream``, ``trace_replay``, ``downtime_sim`` - the downtime studies behind
  `gpuflow bench downtime`: the health models' alarm streams on held-out twin histories,
  the InfiniteHBD fault replay, and what they share (costs, bootstrap, the -67 % verdict).
"""
