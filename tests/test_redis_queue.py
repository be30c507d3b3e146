"""The queue on a real Redis server (`queue.url`, tests/servers.py starts Debian's
redis-server): events go through RedisHuey as through the file's queue, and a reset
refills it from the store's event rows."""

from __future__ import annotations

import pytest
import redis
from session_writers import copilot_session

from llmem.app import App
from llmem.cli import queueing
from workers import tasks

pytestmark = pytest.mark.backend


@pytest.fixture
def redis_app(configure, servers, tmp_path):
    server = servers.redis()
    redis.Redis.from_url(server.url).flushdb()
    state_dir = tmp_path / "copilot" / "session-state"
    state_dir.mkdir(parents=True)
    configure("embedding:\n  provider: none\nllm:\n  provider: none\n"
              f"session:\n  adapter: copilot\n  copilot:\n    state_dir: {state_dir}\n"
              f"queue:\n  url: {server.url}\n"
              "pipeline:\n  min_extraction_interval_seconds: 0\n")
    application = App()
    tasks.use_app(application)
    queueing._queues.clear()  # a queue built for another test's config
    yield application, state_dir, server
    tasks.use_app(None)
    queueing._queues.clear()
    application.close()


def test_an_event_is_queued_in_redis_and_a_worker_runs_it(redis_app):
    app, state_dir, server = redis_app
    session = copilot_session(state_dir)
    session.turn("remember that the staging database listens on port 5433")
    huey, _ = queueing.open_queue(app.config)
    assert type(huey).__name__ == "RedisHuey"

    event_id = queueing.submit_event(app, "copilot", session.id, "idle")

    assert huey.pending_count() == 1
    # The task is in the Redis server itself (another machine's worker would see it), not here.
    assert redis.Redis.from_url(server.url).dbsize() >= 1
    assert not app.config.queue_path.exists()
    task = huey.dequeue()
    huey.execute(task)
    Event = app.store.models.Event
    assert Event.get(Event.id == event_id).status == "done"
    assert any("5433" in m.content for m in app.store.models.Memory.select())
    assert huey.pending_count() == 0


def test_a_reset_refills_the_redis_queue_from_the_event_rows(redis_app):
    app, state_dir, _ = redis_app
    session = copilot_session(state_dir)
    session.turn("remember that releases go out on thursdays")
    huey, _ = queueing.open_queue(app.config)
    event_id = queueing.submit_event(app, "copilot", session.id, "idle")
    _, registered = queueing.open_queue(app.config)
    registered.process_event(event_id)  # queued twice now, and a stray entry beside them
    huey.storage.enqueue(b"not a task")
    assert huey.pending_count() == 3

    moved, requeued = queueing.reset_queue(app)

    assert moved is None and requeued == [event_id]
    huey, _ = queueing.open_queue(app.config)
    assert huey.pending_count() == 1


def test_the_redis_password_is_masked_in_config_show(cli, configure):
    configure("queue:\n  url: redis://:queue-pw-5@127.0.0.1:6379/0\n")
    code, out, err = cli("config", "show")
    assert code == 0, err
    assert "redis://:***@127.0.0.1:6379/0" in out and "queue-pw-5" not in out
