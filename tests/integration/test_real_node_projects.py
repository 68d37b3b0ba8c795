"""Four real JavaScript/TypeScript projects (tests/fixtures/projects, ADR-072) on real
engines: the environment builds from the archive's own lock file (archives from npm's
registry on the host, laid out offline in the image), the whole suite's ``test.run`` has
the counts of the same suite run on the host after the project's own install (computed
here, not written down), and a model's session -- a test importing a module not written
yet (a natural red), the module, the suite green, merge, commit -- lands a commit.

ufo (vitest, TypeScript, pnpm), luxon (jest through babel, npm), commander (node's
runner, ES modules, npm) and ms (ts-jest, jest 30's scoped packages, pnpm) on Docker;
ufo on Podman too (the engine is what Podman changes).
A model also takes ufo from task to commit: fluffy's scripted provider, and the real
OpenAI adapter against a fake OpenAI-compatible server.  The model's loop is the same
for every project (the calls above, made by the AI host): played on one project in CI,
it saved ~150 s (each further project repeats a whole session); on every project with
``FLUFFY_NODE_MODELS_ALL=1``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fluffy.images.environment import ensure_environment
from fluffy.images.templates import template_images
from tests.conftest import connect_engine
from tests.integration.tool_support import Kernel, git
from tests.integration.tool_support import call as tool_call
from tests.node_projects_support import (
    HostRun,
    NodeProject,
    host_run,
    node_projects,
    node_session_steps,
    session_places,
    with_config,
)
from tests.real_projects_support import unpack

pytestmark = pytest.mark.integration
PROJECTS = {project.name: project for project in node_projects()}
CASES = [("docker", name) for name in PROJECTS] + [("podman", "ufo")]
#: the scripted provider and the OpenAI adapter (its wire format, the kernel's proxy) on
#: one project; on each with FLUFFY_NODE_MODELS_ALL=1
MODELS = [
    (name, model)
    for name in PROJECTS
    if name == "ufo" or os.environ.get("FLUFFY_NODE_MODELS_ALL") == "1"
    for model in ("scripted", "openai")
]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Callable[[NodeProject], HostRun]:
    runs: dict[str, HostRun] = {}

    def run(project: NodeProject) -> HostRun:
        if project.name not in runs:
            work = tmp_path_factory.mktemp(f"host-{project.name}")
            tree = unpack(project, work / "tree", git=False)  # type: ignore[arg-type]
            runs[project.name] = host_run(project, tree, work)
        return runs[project.name]

    return run


def call(client: Any, sid: str, tool: str, **args: Any) -> dict[str, Any]:
    answer = tool_call(client, sid, tool, **args)
    assert answer["ok"], (tool, answer.get("error"))
    return answer


@pytest.mark.parametrize(("runtime", "name"), CASES)
def test_a_real_node_project_runs_as_on_the_host_and_a_session_lands(
    tmp_path: Path, runtime: str, name: str, built_on: Callable[[str], None],
    host: Callable[[NodeProject], HostRun],
) -> None:  # fmt: skip
    project = PROJECTS[name]
    built_on(runtime)
    on_host = host(project)
    assert on_host.counts["passed"] > 100 and on_host.counts["failed"] == 0, on_host.counts
    tmp_path.chmod(0o755)  # the sandbox user reads the project
    repo = unpack(project, tmp_path / "repo")  # type: ignore[arg-type]
    with_config(project, repo)
    (repo / ".env").write_text("TOKEN=the person's own\n")
    with connect_engine(runtime) as engine:
        base = template_images(engine)["code-executor"]
        record, built = ensure_environment(engine, repo, tmp_path / "state", base)
    assert built and record is not None and record.node
    assert record.refused == [], record.refused
    assert not (repo / "node_modules").exists()  # nothing installed into the person's tree
    places = session_places(repo)
    steps = node_session_steps(places)
    kernel = Kernel(tmp_path, repo, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "add fluffyTriple"})
            call(client, sid, steps[0]["tool"], **steps[0]["args"])  # plan.complete
            whole = call(client, sid, "test.run")["output"]
            got = {k: whole["counts"][k] for k in ("passed", "failed", "skipped")}
            got["failed"] += whole["counts"]["error"]
            assert got == on_host.counts, (on_host.counts, whole["output_tail"][-3000:])
            assert "environment" not in whole  # current: no note
            answers = []
            for step in steps[1:]:
                answer = call(client, sid, step["tool"], **step["args"])
                expect = step.get("expect") or {}
                if "state" in expect:
                    assert answer["session"]["state"] == expect["state"], (step, answer["output"])
                answers.append(answer)
    finally:
        kernel.stop()
    red, green = answers[1]["output"], answers[3]["output"]
    assert red["red"] is True and "fail on missing code" in red["red_reason"], red
    assert green["failed"] == [] and green["counts"]["passed"] == on_host.counts["passed"] + 1
    assert git(repo, "log", "-1", "--format=%s") == "Add fluffyTriple"
    mine = "?? .env" + ("\n?? .fluffy/" if project.config else "")  # the person's, untouched
    assert git(repo, "status", "--porcelain") == mine
    assert set(git(repo, "show", "--name-only", "--format=", "HEAD").splitlines()) == {
        places["code"],
        places["test"],
    }


def _turns(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's calls as a model's turns, one call each, then "done"."""
    turns = [{"say": f"Next: {s['tool']}.", "calls": [{"tool": s["tool"], "args": s["args"]}]}
             for s in steps]  # fmt: skip
    return [*turns, {"say": "fluffyTriple is added, tested first.", "calls": []}]


def _follow(client: Any, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:  # the kernel's own turn limits end it; the client's timeout bounds the wait
        page = client.call("session.events", {"session_id": sid, "after": after, "wait_ms": 2000})
        events += page["events"]
        after = page["next"]
        if any(e["type"] == "turn_end" for e in page["events"]):
            return events


@pytest.mark.parametrize(("name", "model"), MODELS)
def test_a_model_takes_a_real_node_project_from_task_to_commit(
    tmp_path: Path, name: str, model: str, built_on: Callable[[str], None]
) -> None:
    """The same session as a model plays it: fluffy's scripted provider, and the real
    OpenAI adapter in its sandbox talking to a fake OpenAI-compatible server on loopback
    through the kernel's proxy (the project's policy allow-lists it, as a person would)."""
    from fluffy.host.project import detect_layout, render_policy
    from fluffy.sandboxes.ai.calls import wire_name
    from tests.fakes.llm import FakeOpenAIServer, Reply

    project = PROJECTS[name]
    built_on("docker")
    tmp_path.chmod(0o755)
    repo = unpack(project, tmp_path / "repo")  # type: ignore[arg-type]
    with_config(project, repo)
    steps = node_session_steps(session_places(repo))
    turns = _turns(steps)
    with connect_engine("docker") as engine:
        base = template_images(engine)["code-executor"]
        ensure_environment(engine, repo, tmp_path / "state", base)
    replies = [Reply(t["say"], [(wire_name(c["tool"]), c["args"]) for c in t["calls"]])
               for t in turns]  # fmt: skip
    with FakeOpenAIServer(replies) as server:
        provider: dict[str, Any] = {"name": "scripted", "turns": turns}
        if model == "openai":
            port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
            policy = render_policy(detect_layout(repo))
            (repo / ".fluffy").mkdir(exist_ok=True)
            (repo / ".fluffy" / "policy.yaml").write_text(
                f"{policy}\nnetwork_whitelist:\n  - '127.0.0.1:{port}'\n"
            )
            provider = {"name": "openai", "model": "fake-model", "base_url": server.base_url}
        kernel = Kernel(tmp_path, repo, "docker").start()
        try:
            with kernel.client() as client:
                sid = client.call("session.create")["session_id"]
                client.call("session.message", {"session_id": sid, "text": "Add fluffyTriple",
                                                "provider": provider,
                                                "auto_approve": True})  # fmt: skip
                events = _follow(client, sid)
        finally:
            kernel.stop()
        asked = len(server.requests)
    end = events[-1]
    assert end["type"] == "turn_end" and end["status"] == "done", end
    refused = [e for e in events if e["type"] == "tool_result" and not e["ok"]]
    assert refused == [], refused
    assert [e["message"] for e in events if e["type"] == "commit"] == ["Add fluffyTriple"]
    assert git(repo, "log", "-1", "--format=%s") == "Add fluffyTriple"
    assert asked == (len(turns) if model == "openai" else 0)  # one request per model round
