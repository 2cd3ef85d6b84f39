"""`serve --demo --experiment` in process with a multiprocess directory: the experiment lives in the directory while
the service runs, ends with it, and a restart gets the next free id."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import ServiceSettings


def serve_once(directory) -> list[dict]:
    app = create_app(ServiceSettings(demo=True, multiproc_dir=str(directory), experiment="aa", experiment_fraction=0.1,
                                     demo_limit=30, demo_duty=1.0, flush_interval_s=0.2))
    # running before the demo's first call: the registry has picked the directory's config up at the start
    control = app.state.routescope.experiments
    current = control.registry.current
    assert current is not None and current.running and current.config.id == control.owned
    with TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as c:
        assert app.state.routescope.demo.wait_done(120)
        app.state.routescope.experiments.registry.flush()
        running = c.get("/experiments").json()["experiments"]
    return running


def test_the_demo_experiment_runs_in_the_directory_and_ends_with_the_service(tmp_path):
    (first,) = serve_once(tmp_path)
    assert first["id"] == "aa" and first["state"] == "running" and first["processes"] == 1
    assert sum(c["calls_a"] + c["calls_b"] for c in first["cells"]) > 0
    assert (tmp_path / "experiments" / "aa.stop.json").exists()  # stopped at shutdown, for every process there
    second = {e["id"]: e for e in serve_once(tmp_path)}
    assert second["aa"]["state"] == "stopped" and second["aa"]["stop_reason"] == "user"
    assert second["aa-2"]["state"] == "running"  # the id a person used before is never reused


def test_a_running_experiment_left_in_the_directory_refuses_the_demos_start_with_the_way_out(tmp_path):
    from service.experiment_control import ControlFailed, directory_control

    directory_control(tmp_path).start({"id": "other", "candidate": "aa"})
    with pytest.raises(ControlFailed) as err:
        create_app(ServiceSettings(demo=True, multiproc_dir=str(tmp_path), experiment="aa"))
    assert err.value.status == 409 and "'other' is running" in err.value.message
    assert "routescope experiment stop ID" in err.value.message
