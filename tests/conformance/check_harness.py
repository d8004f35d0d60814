#!/usr/bin/env python3
"""Self-check of the conformance harness (run with .cache/venv-vllm/bin/python).

Starts vllm_publisher.py as a subprocess exactly as a Rust test would, subscribes
with a plain pyzmq SUB, replays with a DEALER, and checks framing, sequence numbers,
the dropped-step gap, replay contents and the end marker. Prints a hex dump of one
message of each kind with --dump. Exit 0 = ok.
"""

import json
import os
import socket
import subprocess
import sys

import msgspec
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
END = b"\xff" * 8
BIG = (1 << 64) - 1  # > 2^63: must go out as msgpack uint64
H1, H2, H3 = 0x8000_0000_0000_0001, BIG, 12345


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario(live: str, replay: str) -> dict:
    return {
        "endpoint": live, "replay_endpoint": replay, "topic": "kv-events", "dp_rank": None,
        "linger_s": 30,
        "steps": [
            {"ts": 1700000000.5, "events": [
                {"type": "BlockStored", "block_hashes": [H1, H2], "parent_block_hash": None,
                 "token_ids": list(range(32)), "block_size": 16, "lora_id": None,
                 "medium": "GPU", "lora_name": None, "group_idx": 0}]},
            {"ts": 1700000001.0, "drop": True, "events": [
                {"type": "BlockStored", "block_hashes": [H3], "parent_block_hash": H2,
                 "token_ids": list(range(32, 48)), "block_size": 16, "medium": "GPU"}]},
            {"ts": 1700000002.0, "events": [
                {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU", "group_idx": 0}]},
            {"ts": 1700000003.0, "events": [{"type": "AllBlocksCleared"}]},
            {"ts": 1700000004.0, "events": [
                {"type": "BlockStored", "block_hashes": [{"hex": "ab" * 32}],
                 "parent_block_hash": {"hex": "cd" * 32}, "token_ids": [1, 2, 3, 4],
                 "block_size": 4, "medium": None, "lora_id": 7, "lora_name": "adapter-a",
                 "extra_keys": [["adapter-a", "salt"]], "kv_cache_spec_kind": "full_attention"},
                {"type": "BlockRemoved", "block_hashes": [-5], "medium": "CPU"}]},
        ],
    }


def hexdump(b: bytes) -> str:
    return " ".join(f"{x:02x}" for x in b)


def main() -> int:
    dump = "--dump" in sys.argv
    lp, rp = free_port(), free_port()
    # "tcp://*:P" -> vLLM binds (wildcard); the replay ROUTER always binds.
    scn = scenario(f"tcp://*:{lp}", f"tcp://127.0.0.1:{rp}")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_publisher.py"), "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def send(line):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def expect(prefix):
        line = proc.stdout.readline().rstrip("\n")
        assert line.startswith(prefix), f"expected {prefix}, got {line!r}"
        rest = line[len(prefix):].strip()
        return json.loads(rest) if rest.startswith("{") else rest

    send(json.dumps(scn))
    ready = expect("READY")
    print("READY", ready)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")  # subscribe to all; topic frame checked below
    sub.connect(f"tcp://127.0.0.1:{lp}")
    send("wait_sub 1 5")
    assert expect("SUBSCRIBED") == "1"

    sent = []
    for _ in scn["steps"]:
        send("next")
        sent.append(expect("SENT"))
    done = expect("DONE")
    assert [s["seq"] for s in sent] == [0, 1, 2, 3, 4], sent
    assert done["last_seq"] == 4

    live = []
    while sub.poll(500):
        live.append(sub.recv_multipart())
    assert all(len(m) == 3 for m in live), [len(m) for m in live]
    assert all(m[0] == b"kv-events" for m in live)
    seqs = [int.from_bytes(m[1], "big") for m in live]
    assert seqs == [0, 2, 3, 4], f"live seqs {seqs} (1 must be dropped)"
    for m, s in zip(live, [sent[0], sent[2], sent[3], sent[4]]):
        assert m[2].hex() == s["payload_hex"]

    dec = msgspec.msgpack.decode
    b0 = dec(live[0][2])
    assert b0 == [1700000000.5, [{"type": "BlockStored", "block_hashes": [H1, H2],
                                  "parent_block_hash": None, "token_ids": list(range(32)),
                                  "block_size": 16, "lora_id": None, "medium": "GPU",
                                  "lora_name": None, "group_idx": 0}], 0], b0
    assert live[0][2][-0:] and b"\xcf" + BIG.to_bytes(8, "big") in live[0][2]  # uint64
    b4 = dec(live[3][2])
    assert b4[1][0]["block_hashes"] == [bytes.fromhex("ab" * 32)]
    assert b4[1][1]["block_hashes"] == [-5]

    # Replay from seq 1 with a DEALER: [b"", seq8] -> [b"", topic, seq8, payload]..., end.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(ready["replay_endpoint"])
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    rep = []
    while True:
        assert dealer.poll(3000), "replay timed out"
        m = dealer.recv_multipart()
        rep.append(m)
        if m[2] == END:
            break
    assert all(len(m) == 4 and m[0] == b"" for m in rep)
    assert [int.from_bytes(m[2], "big") for m in rep[:-1]] == [1, 2, 3, 4]
    assert all(m[1] == b"kv-events" for m in rep[:-1])
    assert rep[1 - 1][3].hex() == sent[1]["payload_hex"]  # the dropped step is replayable
    assert rep[-1] == [b"", b"", END, b""], rep[-1]  # end marker: EMPTY topic frame

    # A malformed request (2 frames at the ROUTER: no empty delimiter) is ignored.
    dealer.send_multipart([(0).to_bytes(8, "big")])
    assert not dealer.poll(500), "malformed replay request should get no answer"
    # Replay from a seq past the end: only the end marker.
    dealer.send_multipart([b"", (99).to_bytes(8, "big")])
    assert dealer.poll(3000)
    assert dealer.recv_multipart() == [b"", b"", END, b""]

    if dump:
        names = ["batch0 BlockStored (int hashes, one > 2^63)", "batch1 dropped BlockStored",
                 "batch2 BlockRemoved", "batch3 AllBlocksCleared",
                 "batch4 BlockStored (bytes hashes, optional fields) + BlockRemoved (negative)"]
        for n, s in zip(names, sent):
            print(f"--- {n} seq={s['seq']}\n{hexdump(bytes.fromhex(s['payload_hex']))}")
            print("decoded:", dec(bytes.fromhex(s["payload_hex"])))
        print("--- live frames of batch3:", [hexdump(f) for f in live[2]])
        print("--- replay frames of seq 3:", [hexdump(f) for f in rep[2]])
        print("--- replay end marker:", [hexdump(f) for f in rep[-1]])

    send("quit")
    assert expect("BYE") == ""
    assert proc.wait(10) == 0
    print("check_harness: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
