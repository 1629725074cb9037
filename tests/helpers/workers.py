"""The environment of the Prefect workers a test's control plane starts.

A worker asks its server for runs every PREFECT_WORKER_QUERY_SECONDS (10 s by default):
each deployment run a test waits for would wait ~5 s on average just to be picked up,
several times per test. The tests' workers ask every second; nothing else changes.
"""

from __future__ import annotations

FAST_WORKERS = {"PREFECT_WORKER_QUERY_SECONDS": "1"}


def pause_schedules(api_url: str) -> list[str]:
    """Turn off every deployment schedule of the server at ``api_url`` and cancel the runs
    those schedules already made; returns the deployments whose schedules were active.

    `gpuflow up` turns the schedules of prefect.yaml on (monitor every minute, the DVFS
    controller for most of an hour, ...): on a test's 2 cores their flow runs would take
    CPU from every other test and keep `down` waiting, and no test checks their work. A
    run already due when the schedule stops is not deleted by the server (only future
    ones are): it is cancelled here, a running one through its worker."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import TERMINAL_STATES, StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelled, Cancelling

    active: dict[str, object] = {}
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for dep in client.read_deployments():
            for sched in client.read_deployment_schedules(dep.id):
                if sched.active:
                    active[dep.name] = dep.id
                    client.update_deployment_schedule(dep.id, sched.id, active=False)
        if not active:
            return []
        live = FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=sorted(TERMINAL_STATES)))
        )
        runs = client.read_flow_runs(
            flow_run_filter=live,
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=list(active.values()))),
        )
        for run in runs:
            waiting = run.state_type in (StateType.SCHEDULED, StateType.PENDING)
            client.set_flow_run_state(run.id, Cancelled() if waiting else Cancelling(), force=True)
    return sorted(active)
