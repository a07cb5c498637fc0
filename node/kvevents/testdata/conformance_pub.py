#!/usr/bin/python3
"""Conformance publisher for prefixmesh's KV-event subscriber (node/kvevents).

It lays batches out as the publishers' own encoders do, field by field: vLLM's structs in
vllm/distributed/kv_events.py (msgspec, tag=True, omit_defaults=True; EventBatch{ts, events,
data_parallel_rank}, BlockStored{block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, lora_name, extra_keys=None, group_idx=None, kv_cache_spec_kind=None,
kv_cache_spec_sliding_window=None}, BlockRemoved{block_hashes, medium, group_idx=None}). Releases
with array_like=True send each struct as an array, the tag first and only a trailing run of
defaults omitted; later ones send maps keyed by field name, the tag under "type" first, every
default-valued field omitted and every field without a default present even when None.
SGLang's python/sglang/srt/disaggregation/kv_events.py keeps the older array form. Debian's
python3-msgpack writes these values in the same smallest forms msgspec does (ints by value,
floats as float64, str/bin by length), so the bytes are the publisher's. Replay is served on a
ZMQ ROUTER socket with Debian's python3-zmq, as vLLM's ZmqEventPublisher._service_replay does.
It cannot import vLLM or msgspec (neither is in Debian).

Other publishers' habits: --parent-zero spells "no parent" as the integer 0 (emulators built from
the llm-d tooling), --first-seq 1 starts the sequence at 1 instead of vLLM's 0.

Usage: conformance_pub.py --flavor vllm|sglang --layout array|map --hashes int|bytes
                          [--replay] [--replay-topic] [--topic T] [--block-size B]
                          [--parent-zero] [--first-seq N]
       conformance_pub.py --golden      prints the golden payloads as JSON {name: hex} and exits
It binds tcp://127.0.0.1 on ephemeral ports, prints one JSON line {"pub": …, "replay": …}, then reads
one JSON command per line on stdin and answers one JSON line per command on stdout:

  {"op": "store", "tokens": [...], "parent": null|<chain index>, "lora": null|"name",
   "extra": null|"mm", "medium": "GPU"}     → stores the full blocks of tokens as one BlockStored
                                               (vLLM) or one per page (SGLang); answers the hashes
  {"op": "store_again", "hash": h}          → the same hash stored a second time
  {"op": "remove", "hashes": [...]}         → BlockRemoved (one event per hash, as vLLM evicts)
  {"op": "clear"}                           → AllBlocksCleared
  {"op": "unknown"}                         → an event with an unknown tag naming a block, in a batch with others
  {"op": "unknown_blockless"}               → an event with an unknown tag naming no block, in a batch with others
  {"op": "drop", "n": k}                    → the next k batches are buffered but not sent live
                                               (a PUB high-water-mark drop)
  {"op": "restart"}                         → a new publisher instance: seq back to 0, empty buffer
  {"op": "forget"}                          → the replay buffer forgets everything sent so far
  (a restart makes the next batch seq 0; the buffer then starts over too)
  {"op": "burst", "n": k, "base": t}        → k one-block chains, tokens from t, back to back
  {"op": "quit"}
"""

import argparse
import hashlib
import json
import queue
import struct
import sys
import threading
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def sglang_page_hash(prev_digest, tokens):
    """SGLang's chain: sha256(previous raw digest || tokens as uint32 little-endian)."""
    h = hashlib.sha256()
    if prev_digest is not None:
        h.update(prev_digest)
    for t in tokens:
        h.update(struct.pack("<I", t))
    return h.digest()


def sglang_int64(digest):
    """hash_str_to_int64: the first 8 bytes as a signed big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


class Publisher:
    def __init__(self, args):
        self.args = args
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        if args.hwm:
            self.pub.setsockopt(zmq.SNDHWM, args.hwm)  # PUB drops beyond it, as vLLM's hwm
            self.pub.setsockopt(zmq.SNDBUF, 4096)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.pub_ep = "tcp://127.0.0.1:%d" % port
        self.router = None
        self.replay_ep = None
        if args.replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_ep = "tcp://127.0.0.1:%d" % rport
        self.poller = zmq.Poller()
        if self.router is not None:
            self.poller.register(self.router, zmq.POLLIN)
        self.restart()
        # vLLM hashes are opaque to the subscriber: any unique value per block (digest-like).
        self.counter = 0
        self.digests = {}  # published key -> (digest bytes, tokens, parent key)

    def restart(self):
        self.seq = self.args.first_seq
        self.buffer = []
        self.drop = 0

    # -- msgspec-like encoding ---------------------------------------------------------------
    def wire_hash(self, key):
        if self.args.flavor == "sglang":
            return key  # already a signed int64
        if self.args.hashes == "bytes":
            return key.to_bytes(8, "big").rjust(32, b"\x5a")  # a 32-byte digest ending in the key
        return key

    def wire_parent(self, parent):
        if parent is None:
            return 0 if self.args.parent_zero else None
        return self.wire_hash(parent)

    def block_stored(self, hashes, parent, tokens, lora_name, extra_keys, medium):
        bs = self.args.block_size
        if self.args.flavor == "sglang":
            fields = ["BlockStored", [self.wire_hash(h) for h in hashes],
                      self.wire_parent(parent), tokens, len(tokens), None, medium]
            if self.args.layout == "map":
                return {"type": "BlockStored", "block_hashes": fields[1], "parent_block_hash": fields[2],
                        "token_ids": tokens, "block_size": len(tokens), "lora_id": None, "medium": medium}
            return fields
        ev = [("block_hashes", [self.wire_hash(h) for h in hashes]),
              ("parent_block_hash", self.wire_parent(parent)),
              ("token_ids", tokens), ("block_size", bs), ("lora_id", None), ("medium", medium),
              ("lora_name", lora_name), ("extra_keys", extra_keys), ("group_idx", None),
              ("kv_cache_spec_kind", "full_attention"), ("kv_cache_spec_sliding_window", None)]
        return self.encode_struct("BlockStored", ev, required=7)

    def block_removed(self, hashes, medium="GPU"):
        if self.args.flavor == "sglang":
            if self.args.layout == "map":
                return {"type": "BlockRemoved", "block_hashes": [self.wire_hash(h) for h in hashes], "medium": medium}
            return ["BlockRemoved", [self.wire_hash(h) for h in hashes], medium]
        return self.encode_struct("BlockRemoved", [("block_hashes", [self.wire_hash(h) for h in hashes]),
                                                   ("medium", medium), ("group_idx", None)], required=2)

    def encode_struct(self, tag, fields, required):
        """omit_defaults: a field whose value is its default (None) is left out; in array form only
        the trailing run of defaults can go. The first `required` fields have no default."""
        if self.args.layout == "map":
            out = {"type": tag}
            for i, (k, v) in enumerate(fields):
                if v is not None or i < required:
                    out[k] = v
            return out
        values = [v for _, v in fields]
        n = len(values)
        while n > required and values[n - 1] is None:
            n -= 1
        return [tag] + values[:n]

    # -- sending ------------------------------------------------------------------------------
    def publish(self, events):
        payload = encode_batch(self.args, time.time(), events, 0)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if len(self.buffer) > self.args.buffer_steps:
            self.buffer = self.buffer[-self.args.buffer_steps:]
        if self.drop > 0:
            self.drop -= 1
        else:
            self.pub.send_multipart([self.args.topic.encode(), seq.to_bytes(8, "big"), payload])
        return seq

    def serve_replay(self, timeout_ms):
        if self.router is None:
            time.sleep(timeout_ms / 1000.0)
            return
        while dict(self.poller.poll(timeout_ms)).get(self.router):
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue  # "Invalid replay request": no answer, as vLLM
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= start:
                    self.router.send_multipart(self.reply(ident, seq.to_bytes(8, "big"), payload))
            self.router.send_multipart(self.reply(ident, END_SEQ, b"", end=True))
            timeout_ms = 0

    def reply(self, ident, seq8, payload, end=False):
        if self.args.replay_topic:  # vLLM >= v0.26.0 (#45177)
            return [ident, b"", b"" if end else self.args.topic.encode(), seq8, payload]
        return [ident, b"", seq8, payload]

    # -- commands -----------------------------------------------------------------------------
    def new_key(self):
        self.counter += 1
        if self.args.flavor == "vllm":
            # An int-mode vLLM hash is the last 8 bytes of a sha256 digest: spread over 64 bits.
            return int.from_bytes(hashlib.sha256(b"blk%d" % self.counter).digest()[-8:], "big")
        return None

    def cmd_store(self, c):
        bs = self.args.block_size
        tokens = c["tokens"]
        nfull = len(tokens) // bs
        tokens = tokens[:nfull * bs]
        parent = c.get("parent")
        medium = c.get("medium", "GPU")
        if self.args.flavor == "sglang":
            prev_digest = None if parent is None else self.digests[parent][0]
            keys, events = [], []
            for i in range(nfull):
                page = tokens[i * bs:(i + 1) * bs]
                d = sglang_page_hash(prev_digest, page)
                key = sglang_int64(d)
                self.digests[key] = (d, page, parent)
                events.append(self.block_stored([key], parent, page, None, None, medium))
                keys.append(key)
                parent, prev_digest = key, d
            seq = self.publish(events)
            return {"hashes": keys, "digests": [self.digests[k][0].hex() for k in keys], "seq": seq}
        keys = [self.new_key() for _ in range(nfull)]
        lora = c.get("lora")
        extra = None
        if c.get("extra") == "mm":
            extra = [[("img-%d" % i), 0] if i == 0 else None for i in range(nfull)]
        elif lora is not None:
            extra = [[lora] for _ in range(nfull)]
        for i, k in enumerate(keys):
            self.digests[k] = (None, tokens[i * bs:(i + 1) * bs], parent if i == 0 else keys[i - 1])
        seq = self.publish([self.block_stored(keys, parent, tokens, lora, extra, medium)])
        return {"hashes": keys, "seq": seq}

    def cmd_store_again(self, c):
        key = c["hash"]
        _, page, parent = self.digests[key]
        if self.args.flavor == "sglang":
            ev = self.block_stored([key], parent, page, None, None, "GPU")
        else:
            ev = self.block_stored([key], parent, page, None, None, "GPU")
        return {"seq": self.publish([ev])}

    def run(self):
        # Sockets stay on this thread; a reader thread hands stdin lines over a queue, so replay
        # requests are served while no command is pending (vLLM serves them between sends).
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in sys.stdin] + [lines.put(None)], daemon=True).start()
        print(json.dumps({"pub": self.pub_ep, "replay": self.replay_ep}), flush=True)
        while True:
            self.serve_replay(10)
            try:
                line = lines.get(timeout=0.01)
            except queue.Empty:
                continue
            if line is None:
                break
            c = json.loads(line)
            op = c["op"]
            out = {}
            if op == "store":
                out = self.cmd_store(c)
            elif op == "store_again":
                out = self.cmd_store_again(c)
            elif op == "remove":
                out = {"seq": self.publish([self.block_removed([h]) for h in c["hashes"]])}
            elif op == "clear":
                tag = "AllBlocksCleared"
                out = {"seq": self.publish([{"type": tag} if self.args.layout == "map" else [tag]])}
            elif op == "unknown":
                ev = {"type": "BlockInactive", "block_hashes": [1]} if self.args.layout == "map" else ["BlockInactive", [1]]
                out = {"seq": self.publish([ev, self.block_removed([1 << 40])])}
            elif op == "unknown_blockless":  # a kind naming no blocks (an engine's statistics, say)
                ev = {"type": "KVCacheStats", "num_blocks": 3} if self.args.layout == "map" else ["KVCacheStats", 3]
                out = {"seq": self.publish([ev, self.block_removed([1 << 40])])}
            elif op == "drop":
                self.drop = c["n"]
            elif op == "restart":
                self.restart()
            elif op == "forget":
                self.buffer = []
            elif op == "burst":  # n one-block chains back to back, as fast as the socket takes them
                keys = []
                for i in range(c["n"]):
                    keys.append(self.cmd_store({"tokens": [c["base"] + 4 * i + j for j in range(self.args.block_size)]})["hashes"][0])
                out = {"hashes": keys}
            elif op == "quit":
                break
            print(json.dumps(out), flush=True)


def encode_batch(args, ts, events, rank):
    """EventBatch: an array [ts, events, rank] (array_like releases, SGLang) or, in vLLM's map
    layout, a map in field order (data_parallel_rank is set by the publisher, so never omitted)."""
    if args.flavor == "vllm" and args.layout == "map":
        batch = {"ts": ts, "events": events, "data_parallel_rank": rank}
    else:
        batch = [ts, events, rank]
    return msgpack.packb(batch, use_bin_type=True)


def golden():
    """Fixed payloads for the Go decoder's goldens (node/kvevents/golden_test.go)."""
    out = {}
    ts = 1700000000.5

    def args(**kw):
        d = dict(flavor="vllm", layout="map", hashes="int", parent_zero=False, first_seq=0)
        d.update(kw)
        return argparse.Namespace(**d)

    # vLLM map layout, a hybrid model: a full-attention group 0 and a sliding-window group 1.
    a = args()
    full = {"type": "BlockStored", "block_hashes": [2**64 - 1, 17], "parent_block_hash": None,
            "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None, "medium": "GPU",
            "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    swa = {"type": "BlockStored", "block_hashes": [901, 902], "parent_block_hash": None,
           "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None, "medium": "GPU",
           "lora_name": None, "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
           "kv_cache_spec_sliding_window": 128}
    rem = {"type": "BlockRemoved", "block_hashes": [902], "medium": "GPU", "group_idx": 1}
    out["vllm_map_hybrid"] = encode_batch(a, ts, [full, swa, rem], 0).hex()
    # vLLM array_like layout: trailing defaults omitted; medium spelled as other publishers do.
    a = args(layout="array")
    evs = [["BlockStored", [5], None, [1, 2, 3, 4], 4, None, "gpu", None],
           ["BlockStored", [6], 5, [5, 6, 7, 8], 4, None, "CPU_PINNED", None],
           ["BlockStored", [7], 6, [9, 10, 11, 12], 4, None, None, None],
           ["BlockRemoved", [6], "cpu"],
           ["AllBlocksCleared"]]
    out["vllm_array_mediums"] = encode_batch(a, ts, evs, 1).hex()
    # "No parent" as 0 in both layouts (llm-d-derived emulators).
    a = args(layout="array", parent_zero=True)
    out["parent_zero_array"] = encode_batch(a, ts, [["BlockStored", [11], 0, [1, 2, 3, 4], 4, None, "GPU", None]], 0).hex()
    a = args(layout="map", parent_zero=True)
    out["parent_zero_map"] = encode_batch(a, ts, [{"type": "BlockStored", "block_hashes": [11], "parent_block_hash": 0,
                                                   "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None,
                                                   "medium": "GPU", "lora_name": None}], 0).hex()
    # SGLang: signed int64 hashes (hash_str_to_int64), array layout, bytes digests for vLLM's
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
    a = args(flavor="sglang", layout="array")
    out["sglang_negative"] = encode_batch(a, ts, [["BlockStored", [-2, -3], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"]], 0).hex()
    a = args(layout="map")
    out["vllm_bytes"] = encode_batch(a, ts, [{"type": "BlockStored", "block_hashes": [bytes(range(32))],
                                              "parent_block_hash": None, "token_ids": [1, 2, 3, 4], "block_size": 4,
                                              "lora_id": None, "medium": "GPU", "lora_name": None}], 0).hex()
    # Tiers beyond the GPU. vLLM's structs as vllm/distributed/kv_events.py declares them:
    # BlockStored{block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
    # lora_name (the first seven have no default), extra_keys, group_idx, kv_cache_spec_kind,
    # kv_cache_spec_sliding_window, locality, ownership, session_id (default None)} and
    # BlockRemoved{block_hashes, medium (no default), group_idx, locality, ownership}; medium
    # "CPU"/"STORAGE" (MEDIUM_CPU, MEDIUM_STORAGE), locality "LOCAL"/"REMOTE".
    def stored(a, hashes, parent, tokens, bs, medium, group_idx=None, spec=None, locality=None, lora_name=None):
        return Publisher.encode_struct(argparse.Namespace(args=a), "BlockStored", [
            ("block_hashes", hashes), ("parent_block_hash", parent), ("token_ids", tokens), ("block_size", bs),
            ("lora_id", None), ("medium", medium), ("lora_name", lora_name), ("extra_keys", None),
            ("group_idx", group_idx), ("kv_cache_spec_kind", spec), ("kv_cache_spec_sliding_window", None),
            ("locality", locality), ("ownership", None), ("session_id", None)], required=7)

    def removed(a, hashes, medium, group_idx=None, locality=None):
        return Publisher.encode_struct(argparse.Namespace(args=a), "BlockRemoved", [
            ("block_hashes", hashes), ("medium", medium), ("group_idx", group_idx), ("locality", locality),
            ("ownership", None)], required=2)

    a = args(layout="map")
    toks = list(range(1, 25))
    # vLLM >= 0.24 self-describing offload events (vllm/distributed/kv_transfer/kv_connector/v1/
    # offloading/events.py, OffloadingEventsTracker): one BlockStored per offloaded chunk with the
    # chunk's per-block hashes, the whole chunk's token ids, the GPU block size, the parent hash,
    # group_idx and kv_cache_spec_kind, extra_keys None. Here a 16-token CPU chunk over 4-token
    # GPU blocks: six GPU blocks 101..106, then chunk [101..104] and chunk [103..106], which
    # re-announces 103 and 104 (a chunk over an unaligned shared prefix).
    out["vllm_cpu_chunks"] = encode_batch(a, ts, [
        stored(a, [101, 102, 103, 104, 105, 106], None, toks, 4, "GPU", 0, "full_attention"),
        stored(a, [101, 102, 103, 104], None, toks[:16], 4, "CPU", 0, "full_attention"),
        stored(a, [103, 104, 105, 106], 102, toks[8:], 4, "CPU", 0, "full_attention")], 0).hex()
    # Then the GPU evicts its last three blocks, and the CPU evicts chunk 2, then chunk 1: each
    # removal fans out to the chunk's hashes (_take_removed_event).
    out["vllm_cpu_evict"] = encode_batch(a, ts, [
        removed(a, [106, 105, 104], "GPU", 0),
        removed(a, [103, 104, 105, 106], "CPU", 0),
        removed(a, [101, 102, 103, 104], "CPU", 0)], 0).hex()
    # Legacy placeholders (_placeholder_stored: before self-describing events, and for sliding
    # window and SSM groups): one hash, token_ids [], block_size 0, no parent or LoRA.
    out["vllm_placeholders"] = encode_batch(a, ts, [
        stored(a, [102], None, [], 0, "CPU", 0),
        stored(a, [999], None, [], 0, "CPU", 0)], 0).hex()
    # Unified tiering: medium STORAGE with locality LOCAL or REMOTE, removals alike.
    out["vllm_storage_locality"] = encode_batch(a, ts, [
        stored(a, [101, 102, 103, 104], None, toks[:16], 4, "STORAGE", 0, "full_attention", "LOCAL"),
        stored(a, [101, 102, 103, 104], None, toks[:16], 4, "STORAGE", 0, "full_attention", "REMOTE"),
        removed(a, [101, 102, 103, 104], "STORAGE", 0, "REMOTE")], 0).hex()
    # vLLM's array_like layout with the disk medium as DiskLoadStoreSpec.medium() spells it
    # (vllm/v1/kv_offload/mediums.py): a placeholder and its removal.
    a = args(layout="array")
    out["vllm_array_disk"] = encode_batch(a, ts, [
        stored(a, [105], None, [], 0, "Disk", 0),
        removed(a, [105], "Disk", 0)], 0).hex()
    # LMCache through vLLM's LMCacheConnectorV1.get_kv_connector_kv_cache_events
    # (vllm/distributed/kv_transfer/kv_connector/v1/lmcache_connector.py): BlockStored with
    # block_hashes, parent_block_hash, token_ids, lora_id, block_size and LMCache's medium only,
    # never a BlockRemoved.
    a = args(layout="map")
    out["lmcache_stored"] = encode_batch(a, ts, [stored(a, [101, 102], None, toks[:8], 4, "cpu")], 0).hex()
    # SGLang HiCache (python/sglang/srt/disaggregation/kv_events.py, array layout): a host copy
    # as CPU_PINNED, the second host tier, and the device copy's removal.
    a = args(flavor="sglang", layout="array")
    out["sglang_hicache"] = encode_batch(a, ts, [
        ["BlockStored", [-7], None, [1, 2, 3, 4], 4, None, "CPU_PINNED"],
        ["BlockStored", [-7], None, [1, 2, 3, 4], 4, None, "CPU_TIER2"],
        ["BlockRemoved", [-7], "GPU"]], 0).hex()
    print(json.dumps(out, indent=1, sort_keys=True))


def main():
    if "--golden" in sys.argv:
        golden()
        return
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--layout", choices=["array", "map"], default="array")
    p.add_argument("--hashes", choices=["int", "bytes"], default="int")
    p.add_argument("--replay", action="store_true")
    p.add_argument("--replay-topic", action="store_true")
    p.add_argument("--topic", default="")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--hwm", type=int, default=0, help="PUB send high-water mark (0: libzmq's default)")
    p.add_argument("--buffer-steps", type=int, default=10000, help="replay buffer, as vLLM's buffer_steps")
    p.add_argument("--parent-zero", action="store_true", help='"no parent" as 0, not nil')
    p.add_argument("--first-seq", type=int, default=0, help="the first sequence number (vLLM: 0)")
    Publisher(p.parse_args()).run()


if __name__ == "__main__":
    main()
