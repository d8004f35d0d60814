#!/usr/bin/env python3
"""Conformance driver: publish KV events through vLLM 0.33.0's OWN ZmqEventPublisher.

Run with the venv made by setup.sh (never with the system python):

    .cache/venv-vllm/bin/python tests/conformance/vllm_publisher.py SCENARIO.json
    .cache/venv-vllm/bin/python tests/conformance/vllm_publisher.py -      # scenario = first stdin line
    .cache/venv-vllm/bin/python tests/conformance/vllm_publisher.py --self-test
    .cache/venv-vllm/bin/python tests/conformance/vllm_publisher.py --hash < req.json

The publisher classes (ZmqEventPublisher, KVEventBatch, BlockStored, BlockRemoved,
AllBlocksCleared, EventPublisherFactory) and KVEventsConfig are executed from vLLM's
real files in .cache/vllm-src, unmodified. See install_shim() for exactly which
modules are replaced by stand-ins and why. The protocol is documented in README.md.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
import threading
import time
import types
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CACHE = os.environ.get("KVROUTE_CACHE_DIR", os.path.join(REPO, ".cache"))
SRC = os.path.join(CACHE, "vllm-src")

# stdout carries only protocol lines; logs (vLLM's included) go to stderr.
logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                    format="[vllm_publisher] %(levelname)s %(name)s: %(message)s")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- shim
def install_shim(src: str = SRC) -> types.ModuleType:
    """Make `import vllm.distributed.kv_events` load vLLM's real file without
    importing the rest of vLLM (which needs torch). Returns that module.

    A. Package bypass (no code replaced, only package __init__ files skipped):
       vllm, vllm.config, vllm.distributed, vllm.utils, vllm.v1, vllm.v1.core are
       registered as empty packages whose __path__ is the real extracted directory,
       so their submodules load from vLLM's real files. Their real __init__.py files
       are skipped because they import torch / the whole engine:
         vllm/__init__.py            -> vllm.env_override (torch) + lazy engine exports
         vllm/config/__init__.py     -> every config class (torch, transformers)
         vllm/distributed/__init__.py-> parallel_state, communication_op (torch)
         vllm/utils/__init__.py      -> `import torch`
       None of them defines anything kv_events.py uses.

    B. Stand-ins (modules unrelated to the publisher logic):
       vllm.logger        -> init_logger = logging.getLogger. The real one only adds
                             formatting/config (and imports vllm.logging_utils);
                             kv_events.py/network_utils.py call info/warning/exception.
       vllm.config.utils  -> only `config`, re-implemented exactly as vLLM 0.33.0
                             defines it (pydantic.dataclasses.dataclass with
                             ConfigDict(extra="forbid")); the real file does
                             `import torch` at the top. Checked against the real text.
       vllm.v1.core.kv_cache_utils
                          -> only `ExternalBlockHash = bytes | int` (the sole name
                             kv_events.py imports from it); the real module pulls in
                             the scheduler, multimodal, torch. Checked against the
                             real text. It is a type annotation: msgspec's Encoder
                             encodes by runtime type, so it does not affect encoding.

    C. Real, unmodified, executed: vllm/distributed/kv_events.py,
       vllm/config/kv_events.py, vllm/utils/network_utils.py (get_ip, get_tcp_uri,
       is_valid_ipv6_address, split_zmq_path for `tcp://*:0` binding), vllm/envs.py
       (stdlib only at import), vllm/utils/hashing.py (for --hash).
    """
    if "vllm.distributed.kv_events" in sys.modules:
        return sys.modules["vllm.distributed.kv_events"]
    if not os.path.exists(os.path.join(src, ".complete")):
        sys.exit(f"{src} is missing: run tests/conformance/setup.sh first")

    def read(rel: str) -> str:
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            return f.read()

    # Guard the stand-ins against drift of the real definitions they replace.
    kcu = read("vllm/v1/core/kv_cache_utils.py")
    assert "ExternalBlockHash: TypeAlias = bytes | int" in kcu, "ExternalBlockHash changed"
    cu = read("vllm/config/utils.py")
    assert 'merged_config = ConfigDict(extra="forbid")' in cu, "config decorator changed"
    assert "return dataclass(cls, config=merged_config, **kwargs)" in cu, "config changed"
    assert "from pydantic.dataclasses import dataclass" in cu, "config changed"

    # A. package bypass
    for pkg in ("vllm", "vllm.config", "vllm.distributed", "vllm.utils", "vllm.v1",
                "vllm.v1.core"):
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(src, *pkg.split("."))]
        m.__package__ = pkg
        m.__file__ = None
        sys.modules[pkg] = m
        parent, _, child = pkg.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, m)

    # B. stand-ins
    logger_mod = types.ModuleType("vllm.logger")
    logger_mod.init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules["vllm.logger"] = logger_mod

    from pydantic import ConfigDict
    from pydantic.dataclasses import dataclass as pyd_dataclass

    def config(cls=None, *, config=None, **kwargs):  # same body as vLLM 0.33.0
        merged_config = ConfigDict(extra="forbid")
        if config is not None:
            merged_config.update(config)

        def decorator(c):
            return pyd_dataclass(c, config=merged_config, **kwargs)

        return decorator if cls is None else decorator(cls)

    cu_mod = types.ModuleType("vllm.config.utils")
    cu_mod.config = config  # type: ignore[attr-defined]
    sys.modules["vllm.config.utils"] = cu_mod

    kcu_mod = types.ModuleType("vllm.v1.core.kv_cache_utils")
    kcu_mod.ExternalBlockHash = bytes | int  # type: ignore[attr-defined]
    sys.modules["vllm.v1.core.kv_cache_utils"] = kcu_mod

    # C. the real thing
    import vllm.distributed.kv_events as kv  # noqa: E402

    assert os.path.samefile(kv.__file__, os.path.join(src, "vllm/distributed/kv_events.py"))
    import vllm.config.kv_events as ck
    assert os.path.samefile(ck.__file__, os.path.join(src, "vllm/config/kv_events.py"))
    return kv


# ---------------------------------------------------------------- scenario -> events
def _hash(v: Any) -> int | bytes:
    """JSON -> ExternalBlockHash. int (may exceed 2^63, up to 2^64-1; negatives are
    passed through as msgpack ints) or {"hex": "..."} -> bytes (vLLM's path when
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the raw 32-byte sha256 digest)."""
    if isinstance(v, bool):
        raise ValueError(f"bad hash {v!r}")
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 64):
            raise ValueError(f"hash out of 64-bit range: {v}")
        return v
    if isinstance(v, dict) and set(v) == {"hex"}:
        return bytes.fromhex(v["hex"])
    raise ValueError(f"bad hash {v!r}: use an integer or {{\"hex\": \"...\"}}")


def build_event(kv: types.ModuleType, e: dict) -> Any:
    e = dict(e)
    kind = e.pop("type")
    if kind == "AllBlocksCleared":
        if e:
            raise ValueError(f"AllBlocksCleared takes no fields: {e}")
        return kv.AllBlocksCleared()
    if "block_hashes" in e:
        e["block_hashes"] = [_hash(h) for h in e["block_hashes"]]
    if kind == "BlockStored":
        if e.get("parent_block_hash") is not None:
            e["parent_block_hash"] = _hash(e["parent_block_hash"])
        # Required-but-nullable fields may be left out of the scenario: None.
        for f in ("parent_block_hash", "lora_id", "medium", "lora_name"):
            e.setdefault(f, None)
        if e.get("extra_keys") is not None:
            e["extra_keys"] = [tuple(k) if isinstance(k, list) else k
                               for k in e["extra_keys"]]
        return kv.BlockStored(**e)
    if kind == "BlockRemoved":
        e.setdefault("medium", None)
        return kv.BlockRemoved(**e)
    raise ValueError(f"unknown event type {kind!r}")


# ---------------------------------------------------------------- publisher run
class Stdin:
    """Line reader on a thread so waits can time out; EOF -> None."""

    def __init__(self) -> None:
        self._lines: list[str | None] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for line in sys.stdin:
            with self._cv:
                self._lines.append(line.strip())
                self._cv.notify_all()
        with self._cv:
            self._lines.append(None)
            self._cv.notify_all()

    def get(self, timeout: float | None = None) -> str | None | bool:
        """Next line, None on EOF, False on timeout. EOF is sticky."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._lines, timeout):
                return False
            line = self._lines[0]
            if line is not None:
                self._lines.pop(0)
            return line


def run(scn: dict, stdin: Stdin | None) -> int:
    kv = install_shim()
    import zmq
    from vllm.config.kv_events import KVEventsConfig

    # tcp://*:0 binds "this node's IP" (vllm.utils.network_utils.get_ip, real code):
    # pin it to loopback unless the caller chose otherwise.
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

    cfg_kw = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": scn.get("endpoint", "tcp://*:5557"),
              "replay_endpoint": scn.get("replay_endpoint"),
              "topic": scn.get("topic", "")}
    for k in ("buffer_steps", "hwm", "max_queue_size"):
        if k in scn:
            cfg_kw[k] = scn[k]
    config = KVEventsConfig(**cfg_kw)
    dp_rank = scn.get("dp_rank")
    # As vllm/v1/core/sched/scheduler.py: EventPublisherFactory.create(config, dp_index).
    # dp_rank null -> the factory's default argument (0).
    pub = (kv.EventPublisherFactory.create(config) if dp_rank is None
           else kv.EventPublisherFactory.create(config, dp_rank))
    assert isinstance(pub, kv.ZmqEventPublisher), type(pub)
    resolved = pub.get_publisher_config()

    # Read-only connection monitor on the live PUB socket, for `wait_sub N`.
    # Set up before the first publish, when the publisher thread never touches _pub.
    mon = pub._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                      | zmq.EVENT_DISCONNECTED)
    handshakes = 0

    def wait_sub(n: int, timeout: float) -> int:
        nonlocal handshakes
        from zmq.utils.monitor import recv_monitor_message
        deadline = time.monotonic() + timeout
        while handshakes < n and time.monotonic() < deadline:
            if mon.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                ev = recv_monitor_message(mon)
                if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    handshakes += 1
        # The SUBSCRIBE command follows the handshake on the same pipe; give the
        # PUB's I/O thread a moment to queue it before the next send.
        time.sleep(0.1)
        return handshakes

    # Dropped steps: ZmqEventPublisher's thread does, per batch,
    #   seq = next(self._seq_gen); payload = self._pack.encode(event)
    #   self._pub.send_multipart((topic, seq_bytes, payload))
    #   self._buffer.append((seq, payload))
    # For a "drop" step we point self._pub at a fresh PUB socket with no peers for
    # exactly that one batch (set before publish(), restored after the queue has
    # been drained, i.e. while the thread is idle; attribute swaps are atomic).
    # A PUB with no peers discards, which is exactly what real ZMQ does when a
    # subscriber is disconnected or over its HWM. So vLLM's own code still takes
    # the sequence number, encodes, and buffers the batch for replay; live
    # subscribers just never see it. No vLLM code is modified or re-implemented.
    black_hole = pub._ctx.socket(zmq.PUB)
    black_hole.setsockopt(zmq.LINGER, 0)
    real_pub = pub._pub

    steps = scn.get("steps", [])
    _out("READY " + json.dumps({
        "endpoint": resolved.endpoint, "replay_endpoint": resolved.replay_endpoint,
        "topic": resolved.topic, "dp_rank": pub._data_parallel_rank,
        "buffer_steps": resolved.buffer_steps, "steps": len(steps), "pid": os.getpid(),
    }))

    control = scn.get("control", "stdin")
    if control not in ("stdin", "auto"):
        raise ValueError("control must be 'stdin' or 'auto'")
    if control == "auto":
        time.sleep(float(scn.get("wait_for_subscriber_s", 1.0)))

    def publish_step(i: int, step: dict) -> None:
        events = [build_event(kv, e) for e in step.get("events", [])]
        ts = step.get("ts")
        batch = kv.KVEventBatch(ts=time.time() if ts is None else float(ts), events=events)
        if "dp_rank" in step:  # override; otherwise publish() stamps the rank
            batch.data_parallel_rank = step["dp_rank"]
        drop = bool(step.get("drop", False))
        if drop:
            pub._pub = black_hole
        try:
            pub.publish(batch)
            pub._event_queue.join()  # task_done() runs after send + buffer append
        finally:
            pub._pub = real_pub
        seq, payload = pub._buffer[-1]
        _out("SENT " + json.dumps({"step": i, "seq": seq, "dropped": drop,
                                   "n_events": len(events), "payload_hex": payload.hex()}))

    i = 0
    quit_ = False
    while i < len(steps) and not quit_:
        if control == "auto":
            publish_step(i, steps[i])
            i += 1
            continue
        line = stdin.get() if stdin else None
        if line is None or line == "quit":
            quit_ = True
        elif line.startswith("wait_sub"):
            parts = line.split()
            n = int(parts[1]) if len(parts) > 1 else 1
            t = float(parts[2]) if len(parts) > 2 else 10.0
            # The configured endpoint decides (vLLM resolves tcp://*:0 to a concrete one).
            if not pub._is_bind_endpoint(cfg_kw["endpoint"]):
                # Connect mode: vLLM's PUB connected inside its constructor, before
                # any monitor could be attached, so handshakes are not observable.
                # Also, a *bound* SUB only sends its SUBSCRIBE once the application
                # touches it (poll/recv) after the connection arrives. The test
                # must poll its SUB after READY; we only give it time.
                time.sleep(0.3)
                _out("SUBSCRIBED connect-mode")
                continue
            got = wait_sub(n, t)
            _out(f"SUBSCRIBED {got}" if got >= n else f"ERROR wait_sub timeout ({got}/{n})")
        elif line in ("", "next"):
            publish_step(i, steps[i])
            i += 1
        elif line == "all":
            while i < len(steps):
                publish_step(i, steps[i])
                i += 1
        else:
            _out(f"ERROR unknown command {line!r}")

    last = pub._buffer[-1][0] if pub._buffer else None
    _out("DONE " + json.dumps({"published": i, "last_seq": last}))

    # Linger, serving replay (the publisher thread services the ROUTER), until
    # linger_s elapses or (control=stdin) stdin says quit / closes.
    linger = scn.get("linger_s", 2.0)
    deadline = None if linger is None else time.monotonic() + float(linger)
    while not quit_:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        if control == "stdin" and stdin is not None:
            line = stdin.get(timeout=left)
            if line is None or line == "quit":
                break
        else:
            time.sleep(min(left, 0.2) if left is not None else 0.2)

    mon.close(linger=0)
    black_hole.close(linger=0)
    pub.shutdown()
    _out("BYE")
    return 0


# ---------------------------------------------------------------- --self-test
def self_test() -> int:
    kv = install_shim()
    import msgspec

    for cls in (kv.EventBatch, kv.KVEventBatch, kv.BlockStored, kv.BlockRemoved,
                kv.AllBlocksCleared):
        c = cls.__struct_config__
        print(f"{cls.__name__}: fields={cls.__struct_fields__} "
              f"defaults={len(cls.__struct_defaults__)} array_like={c.array_like} "
              f"omit_defaults={c.omit_defaults} tag={c.tag!r} tag_field={c.tag_field!r}",
              file=sys.stderr)
    b = kv.KVEventBatch(ts=1.0, events=[kv.AllBlocksCleared()], data_parallel_rank=0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(b)) == [1.0, [{"type": "AllBlocksCleared"}], 0]
    print("self-test ok: real vllm/distributed/kv_events.py imported without torch",
          file=sys.stderr)
    return 0


# ---------------------------------------------------------------- --hash
def hash_mode(req: dict) -> int:
    """Reference block hashes from vLLM's own code: sha256/sha256_cbor from the real
    vllm/utils/hashing.py, and init_none_hash / resolve_none_hash_seed /
    hash_block_tokens / maybe_convert_block_hash compiled from the real
    vllm/v1/core/kv_cache_utils.py (only those defs are taken, via ast, unmodified;
    the rest of that module needs torch).

    Request: {"algo": "sha256_cbor"|"sha256", "blocks": [[tok,...], ...],
              "extra_keys": [null|[...], ...] (optional, per block; lists -> tuples),
              "int_hashes": true}
    Honors PYTHONHASHSEED exactly like vLLM (it replaces the "vllm-none-hash" seed).
    """
    install_shim()
    import vllm.envs as envs
    from vllm.utils import hashing

    from typing import Any as _Any, Callable, NewType, Sequence, TypeAlias  # noqa: F401

    path = os.path.join(SRC, "vllm/v1/core/kv_cache_utils.py")
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    want_fn = {"resolve_none_hash_seed", "init_none_hash", "hash_block_tokens",
               "maybe_convert_block_hash"}
    want_var = {"DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS", "_NONE_HASH_SEED",
                "BlockHash"}
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in want_fn:
            body.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in want_var for t in targets):
                body.append(node)
    ns: dict[str, Any] = {"os": os, "envs": envs, "logger": logging.getLogger("kcu"),
                          "Callable": Callable, "Any": _Any, "Sequence": Sequence,
                          "NewType": NewType, "ExternalBlockHash": bytes | int,
                          "xxhash": hashing.xxhash, "xxhash_cbor": hashing.xxhash_cbor}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    missing = want_fn - set(ns)
    assert not missing, missing

    fn = hashing.get_hash_fn_by_name(req.get("algo", "sha256_cbor"))
    ns["init_none_hash"](fn)
    if not req.get("int_hashes", True):
        os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
    extra = req.get("extra_keys") or [None] * len(req.get("blocks", []))
    parent = None
    out = []
    for toks, ek in zip(req.get("blocks", []), extra):
        ek = None if ek is None else tuple(tuple(k) if isinstance(k, list) else k for k in ek)
        h = ns["hash_block_tokens"](fn, parent, toks, ek)
        ext = ns["maybe_convert_block_hash"](h)
        out.append({"digest_hex": h.hex(),
                    "event_hash": ext if isinstance(ext, int) else {"hex": ext.hex()}})
        parent = h
    none_hash = ns["NONE_HASH"]
    print(json.dumps({"none_hash_seed": ns["_NONE_HASH_SEED"], "none_hash_hex": none_hash.hex(),
                      "blocks": out}))
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--self-test"]:
        return self_test()
    if argv[1:2] == ["--hash"]:
        return hash_mode(json.load(sys.stdin))
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    stdin = Stdin()
    if argv[1] == "-":
        first = stdin.get()
        if not first:
            sys.exit("expected the scenario JSON on the first stdin line")
        scn = json.loads(first)
    else:
        with open(argv[1], encoding="utf-8") as f:
            scn = json.load(f)
    if scn.get("control", "stdin") == "auto":
        stdin = None  # stdin is ignored in auto mode
    return run(scn, stdin)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
