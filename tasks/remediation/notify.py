"""Telling the operators: a short summary through a Prefect notification block (webhook,
Slack, email...) and the incident's timeline as markdown (the flow's artifact).

Which block: the flow's ``notify_block`` parameter, else GPUFLOW_NOTIFY_BLOCK; a saved
block is named "<block-type-slug>/<name>" (e.g. "custom-webhook/ops",
"slack-webhook/gpu-oncall"). With none configured the summary goes to the log only, and
the timeline says so: an unconfigured channel must not look like a delivered message.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import UTC, datetime
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.remediation import ledger as L
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.blocks.core import Block
from prefect.blocks.notifications import NotificationBlock
from prefect.cache_policies import NONE
from prefect.exceptions import MissingContextError

log = logging.getLogger(__name__)

NOTIFY_BLOCK_ENV = "GPUFLOW_NOTIFY_BLOCK"


def resolve_notifier(notify: NotificationBlock | str | None) -> NotificationBlock | None:
    """A NotificationBlock from an instance, a saved block's "slug/name", or the env."""
    if isinstance(notify, NotificationBlock):
        return notify
    name = notify or os.environ.get(NOTIFY_BLOCK_ENV) or None
    if name is None:
        return None
    if "/" not in name:
        raise InvalidRequestError(
            f"notification block {name!r}: name it as <block-type-slug>/<name>, "
            "e.g. custom-webhook/ops or slack-webhook/gpu-oncall"
        )
    block = Block.load(name)
    if not isinstance(block, NotificationBlock):
        raise InvalidRequestError(
            f"block {name!r} is a {type(block).__name__}, not a notification block"
        )
    return block


def _clock(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%H:%M:%S.%f")[:-3]


def summary(result: dict[str, Any]) -> tuple[str, str]:
    """(subject, body) of the operators' message for a remediation result."""
    device = result.get("device", "?")
    sku = result.get("sku") or ""
    jobs = result.get("jobs", {})
    moved = [j for j, o in jobs.items() if o.get("status") == "resumed"]
    waiting = [j for j, o in jobs.items() if o.get("status") in ("queued", "in-place")]
    trigger = result.get("trigger", "")
    risk = result.get("risk")
    head = f"{trigger}, risk {risk:.2f}" if risk is not None else trigger
    status = result.get("status", "?")
    if status == "rejected":
        subject = f"[gpuflow] remediation refused for {device}: {result.get('error', '')}"
    else:
        subject = (
            f"[gpuflow] {device} {('(' + sku + ') ') if sku else ''}{status}: "
            f"{len(moved)} job(s) moved, {len(waiting)} waiting ({head})"
        )
    lines = [subject, ""]
    if result.get("incident_id"):
        lines.append(f"incident {result['incident_id']}")
    if result.get("reason"):
        lines.append(f"reason: {result['reason']}")
    if result.get("isolation"):
        iso = result["isolation"]
        lines.append(f"cordoned: {iso.get('target')} ({iso.get('reason')})")
    for node in result.get("spares_activated", []):
        lines.append(f"spare node activated: {node}")
    for job_id, o in jobs.items():
        ck = o.get("checkpoint_id") or "no checkpoint"
        where = f" on {o['target']}" if o.get("target") else ""
        lines.append(
            f"job {job_id}: {o.get('status')}{where} from {ck} ({o.get('checkpoint_how', '?')})"
            + (f" - {o['detail']}" if o.get("detail") else "")
        )
    if not jobs and status != "rejected":
        lines.append("no jobs on the device")
    for owner in result.get("unmanaged", []):
        lines.append(f"left alone (not a gpuflow job): {owner}")
    for key, n in (result.get("short") or {}).items():
        lines.append(f"NO CAPACITY: {n} more {key} needed (no free device, no spare)")
    if result.get("error"):
        lines.append(f"error: {result['error']}")
    return subject, "\n".join(lines)


def timeline_markdown(result: dict[str, Any], timeline: list[dict[str, Any]]) -> str:
    """The incident's timeline as a markdown table (times UTC, offsets from the first)."""
    lines = [
        f"# Remediation of {result.get('device', '?')}",
        "",
        f"Incident `{result.get('incident_id', '-')}`, status **{result.get('status', '?')}**, "
        f"trigger {result.get('trigger', '?')}"
        + (f", risk {result['risk']:.3f}" if result.get("risk") is not None else ""),
        "",
        "| time (UTC) | +s | what | job | detail |",
        "|---|---:|---|---|---|",
    ]
    t0 = timeline[0]["at_s"] if timeline else 0.0
    for e in timeline:
        detail = str(e.get("detail", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {_clock(e['at_s'])} | {e['at_s'] - t0:.2f} | {e['what']} | "
            f"{e.get('job_id', '')} | {detail} |"
        )
    return "\n".join(lines) + "\n"


def send(notifier: NotificationBlock | None, subject: str, body: str) -> bool:
    """Send; True when a channel took it. Errors propagate (the task retries them)."""
    if notifier is None:
        log.warning("no notification block configured (%s); summary:\n%s", NOTIFY_BLOCK_ENV, body)
        return False
    with notifier.raise_on_failure():
        notifier.notify(body=body, subject=subject)
    return True


send_task = task(send, name="notify", retries=3, retry_delay_seconds=3, cache_policy=NONE)


def artifact_key(device: str | None) -> str:
    """The timeline artifact's key: one per device, so its page shows the latest story."""
    slug = re.sub(r"[^a-z0-9-]+", "-", (device or "device").lower()).strip("-")[:60]
    return f"remediation-{slug or 'device'}"


def report(
    channel: NotificationBlock | None,
    result: dict[str, Any],
    ledger: L.Ledger,
    incident_id: str,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """Notify the operators, note it in the timeline, and publish the timeline artifact.

    A notification that fails is recorded, not raised: the remediation itself stands.
    Sets ``result["notified"]`` and ``result["timeline"]``.
    """
    subject, body = summary(result)
    notified = False
    try:
        notified = send_task(channel, subject, body)
    except Exception as exc:  # noqa: BLE001 - the remediation itself stands
        logger.error("notification failed: %s", exc)
        ledger.add(incident_id, L.STEP_FAILED, f"notification failed: {exc}")
    if notified:
        ledger.add(incident_id, L.NOTIFIED, subject)
    result["notified"] = notified
    timeline = list(ledger.incident(incident_id).timeline)
    result["timeline"] = timeline
    try:
        create_markdown_artifact(
            key=artifact_key(result.get("device")),
            markdown=timeline_markdown(result, timeline),
            description=subject[:500],
        )
    except MissingContextError:
        pass  # called outside a flow run: no artifact to attach
