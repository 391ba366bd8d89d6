"""A server run's speculation: as `status` shows it (the guard's view, the calibration's
measured rates, greedy and sampled replies apart), and the served requests its guard and
calibrations watch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lucebox.engine.engines import kinds
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.speculation.specguard import Decision
from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run.calibrate.calibration import by_sampling, sampled_at
from lucebox.engine.run.calibrate.calibrator import running_label
from lucebox.engine.run.front.front import Front
from lucebox.engine.run.runsetup import Calibrations
from lucebox.engine.run.sample import Sample, SpecStatus
from lucebox.engine.run.specwatch import SpecWatch, step


def spec_view(
    watch: SpecWatch,
    calibrations: Calibrations,
    launch: ServerLaunch,
    front: Front | None,
    sampled: SpecStatus | None,
) -> SpecStatus | None:
    """The speculation ``launch`` serves with, as the guard and the calibration see it."""
    spec = watch.view(sampled)
    calibrator = calibrations.speculation
    label = running_label(launch)
    if calibrator is not None:
        spec = calibrator.spec_view(label, spec)
    if spec is None or front is None:
        return spec
    # Greedy and sampled replies apart, each where measured or counted.
    mix = front.sampling.status()
    if calibrator is not None:
        rates = calibrator.sampling_rates(label, mix)
    else:
        rates = by_sampling({}, label, mix, sampled_at(mix))
    return replace(spec, by_sampling=rates)


def feed_calibrations(
    calibrations: Calibrations,
    front: Front | None,
    launch: ServerLaunch,
    requests: Sequence[ServedRequest],
) -> None:
    """Give each calibration the requests served since the last sample, with the front's
    sampling mix."""
    if calibrations.engine is not None:
        calibrations.engine.observe(requests)
    if calibrations.kv_modes is not None:
        calibrations.kv_modes.mix = front.sampling if front else None
        calibrations.kv_modes.observe(requests)
    if calibrations.speculation is not None and kinds.kind(launch.kind).calibrates_speculation:
        calibrations.speculation.mix = front.sampling if front else None
        calibrations.speculation.observe(requests)  # its trials ran on this kind


def watch_step(
    watch: SpecWatch,
    calibrations: Calibrations,
    front: Front | None,
    launch: ServerLaunch,
    sample: Sample,
    requests: Sequence[ServedRequest],
    engine_pid: int,
    *,
    applies: bool,
) -> tuple[SpecWatch, Decision | None]:
    """The guard and the calibrations fed the requests that finished since the last sample
    (of engine ``engine_pid``); the guard's decision to apply now, if any."""
    if calibrations.measuring:
        return watch, None  # the probes' requests are the calibration's own
    feed_calibrations(calibrations, front, launch, requests)
    return step(watch, sample, requests, engine_pid, applies=applies, spec_type=launch.spec_type)
