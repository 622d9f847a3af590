"""A Producer, Consumer or AdminClient (and their exactly.aio forms) garbage-collected
without close() warns with a ResourceWarning, naming where it was created when Python
runs in debug mode (exactly._unclosed; aiokafka's clients do the same); a closed one
does not warn, and an unclosed producer's sender thread stops."""
from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import warnings

import pytest

from exactly import AdminClient, Consumer, Producer
from exactly.aio import AIOAdminClient, AIOConsumer, AIOProducer

# Nothing listens here: none of the clients below sends a request.
CONF = {"bootstrap.servers": "127.0.0.1:9"}
SYNC = [(Producer, CONF), (Consumer, {**CONF, "group.id": "g"}), (AdminClient, CONF)]
ASYNC = [(AIOProducer, CONF), (AIOConsumer, {**CONF, "group.id": "g"}), (AIOAdminClient, CONF)]


def _collected(make) -> list[warnings.WarningMessage]:
    """The ResourceWarnings of making a client with `make()` and dropping it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()  # what earlier tests left unclosed warns here, not below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
        gc.collect()
    return [w for w in caught if issubclass(w.category, ResourceWarning)]


def _make_and_drop(cls, conf) -> None:
    cls(conf)  # made here: the debug-mode stack names this line


@pytest.mark.parametrize("cls, conf", SYNC, ids=lambda v: getattr(v, "__name__", ""))
def test_an_unclosed_client_warns_when_collected(cls, conf, monkeypatch):
    monkeypatch.delenv("PYTHONASYNCIODEBUG", raising=False)
    found = _collected(lambda: _make_and_drop(cls, conf))
    assert len(found) == 1, [str(w.message) for w in found]
    message = str(found[0].message)
    assert message.startswith(f"unclosed {cls.__name__} ")
    assert "run Python with -X dev to see where it was created" in message
    assert found[0].source is not None and type(found[0].source) is cls


@pytest.mark.parametrize("cls, conf", SYNC, ids=lambda v: getattr(v, "__name__", ""))
def test_in_debug_mode_the_warning_says_where_the_client_was_created(cls, conf, monkeypatch):
    monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    (found,) = _collected(lambda: _make_and_drop(cls, conf))
    message = str(found.message)
    assert f"{cls.__name__} created at (most recent call last):" in message
    assert "in _make_and_drop" in message and "cls(conf)  # made here" in message


@pytest.mark.parametrize("cls, conf", SYNC, ids=lambda v: getattr(v, "__name__", ""))
def test_a_closed_client_does_not_warn(cls, conf):
    def make_close_drop():
        client = cls(conf)
        client.close()
    assert _collected(make_close_drop) == []
    with_block = lambda: cls(conf).__exit__(None, None, None)  # noqa: E731 - as `with cls(conf):`
    assert _collected(with_block) == []


def test_an_unclosed_producer_stops_its_sender_thread():
    producer = Producer(CONF)
    sender = producer._sender
    assert sender.is_alive()
    del producer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    sender.join(5)
    assert not sender.is_alive()


@pytest.mark.parametrize("cls, conf", ASYNC, ids=lambda v: getattr(v, "__name__", ""))
def test_an_unclosed_asyncio_client_warns_with_its_creation_in_a_debug_loop(cls, conf, monkeypatch):
    monkeypatch.delenv("PYTHONASYNCIODEBUG", raising=False)

    async def scenario(debug: bool) -> list[warnings.WarningMessage]:
        asyncio.get_running_loop().set_debug(debug)
        found = _collected(lambda: _make_and_drop(cls, conf))
        for _ in range(3):  # the release it scheduled on the loop runs
            await asyncio.sleep(0)
        return found

    (plain,) = asyncio.run(scenario(False))
    assert str(plain.message).startswith(f"unclosed {cls.__name__} ")
    assert "-X dev" in str(plain.message)
    (debug,) = asyncio.run(scenario(True))
    assert f"{cls.__name__} created at (most recent call last):" in str(debug.message)
    assert "cls(conf)  # made here" in str(debug.message)


@pytest.mark.parametrize("cls, conf", ASYNC, ids=lambda v: getattr(v, "__name__", ""))
def test_a_closed_asyncio_client_does_not_warn(cls, conf):
    async def scenario() -> list[warnings.WarningMessage]:
        async def make_close_drop():
            client = cls(conf)
            await client.close()
        _collected(lambda: None)  # what earlier tests left unclosed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await make_close_drop()
            gc.collect()
        return [w for w in caught if issubclass(w.category, ResourceWarning)]

    assert asyncio.run(scenario()) == []


def test_python_x_dev_shows_the_line_that_made_the_client(tmp_path):
    """The warning as a user sees it: `python -X dev` prints it on stderr with the
    stack that created the producer."""
    program = textwrap.dedent("""
        from exactly import Producer

        def make():
            Producer({"bootstrap.servers": "127.0.0.1:9"})  # the forgotten producer

        make()
    """)
    (tmp_path / "app.py").write_text(program)
    out = subprocess.run([sys.executable, "-X", "dev", "app.py"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed Producer" in out.stderr
    assert "Producer created at (most recent call last):" in out.stderr
    assert 'app.py", line 5, in make' in out.stderr and "the forgotten producer" in out.stderr
