"""An in-process gRPC stand-in for the services, just enough to drive the SDK's
producer: metadata, produce with KIP-98 sequence/epoch checks, transaction
coordinator RPCs with fencing, TxnOffsetCommit with a generation check, and
fault injection. It binds 127.0.0.1:0 (docs/design.md, "Code conventions"); it is not the services."""
from __future__ import annotations

import collections
import threading
from concurrent import futures

import grpc

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg


class FakeCluster(pbg.ClusterServicer, pbg.PartitionLeaderServicer, pbg.TransactionCoordinatorServicer,
                  pbg.GroupCoordinatorServicer):
    def __init__(self, topics: dict[str, int] | None = None):
        self.lock = threading.RLock()
        self.topics: dict[str, int] = dict(topics or {})
        self.logs: dict[tuple[str, int], list[bytes]] = collections.defaultdict(list)
        self.next_offset: dict[tuple[str, int], int] = collections.defaultdict(int)
        # (pid, tp) -> list of (first_seq, last_seq, base_offset), last 5 batches
        self.producer_batches: dict[tuple[int, int, tuple[str, int]], list] = collections.defaultdict(list)
        self.pid_epoch: dict[int, int] = {}
        self.next_pid = 1000
        self.txn_ids: dict[str, int] = {}
        self.txn_partitions: dict[str, set] = collections.defaultdict(set)
        self.txn_groups: dict[str, set] = collections.defaultdict(set)
        self.ended: list[tuple[str, bool, frozenset]] = []
        self.group_generation: dict[str, int] = {}
        self.pending_offsets: dict[str, dict] = {}
        self.committed_offsets: dict[str, dict] = collections.defaultdict(dict)
        self.produce_requests: list[pb.ProduceRequest] = []
        self.add_partitions_requests: list[pb.AddPartitionsToTxnRequest] = []
        self.init_requests: list[pb.InitProducerIdRequest] = []
        self.metadata_requests: list[pb.MetadataRequest] = []
        self.calls: collections.Counter = collections.Counter()
        # Fault injection: codes returned (once each) before normal handling.
        self.produce_faults: collections.deque = collections.deque()  # (topic, partition, code, write_anyway)
        self.add_partitions_faults: collections.deque = collections.deque()
        self.end_txn_faults: collections.deque = collections.deque()
        self.init_faults: collections.deque = collections.deque()
        self.find_faults: collections.deque = collections.deque()
        # Metadata's transaction_version: 2 = the leader adds a producer's partitions
        # (KIP-890 part 2, ProduceRequest.add_partitions_to_txn).
        self.transaction_version = 0
        # EndTxn answers INVALID_TXN_STATE when nothing was added (as the coordinator).
        self.strict_end_txn = False
        self.produce_delay = threading.Event()
        self.produce_delay.set()
        # An Event the next Produce request (only that one) waits for before it is handled.
        self.hold_next_produce: threading.Event | None = None
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pbg.add_ClusterServicer_to_server(self, self.server)
        pbg.add_PartitionLeaderServicer_to_server(self, self.server)
        pbg.add_TransactionCoordinatorServicer_to_server(self, self.server)
        pbg.add_GroupCoordinatorServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self):
        self.server.stop(0)

    # ---------------------------------------------------------------- Cluster
    def Metadata(self, request, context):
        self.calls["Metadata"] += 1
        with self.lock:
            self.metadata_requests.append(request)
            names = list(request.topics) or sorted(self.topics)
            topics = []
            for n in names:
                if n not in self.topics:
                    topics.append(pb.TopicMetadata(name=n, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                topics.append(pb.TopicMetadata(name=n, partitions=[
                    pb.PartitionMetadata(partition=p, leader_id="n1", replicas=["n1"], isr=["n1"])
                    for p in range(self.topics[n])]))
        return pb.MetadataResponse(
            nodes=[pb.Node(node_id="n1", role="txn_coordinator", host="127.0.0.1", port=self.port)],
            topics=topics, transaction_version=self.transaction_version)

    def CreateTopics(self, request, context):
        out = []
        with self.lock:
            for t in request.topics:
                if t.name in self.topics:
                    out.append(pb.CreatableTopicResult(name=t.name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS))
                elif t.num_partitions < 1:
                    out.append(pb.CreatableTopicResult(name=t.name, error_code=ErrorCode.INVALID_PARTITIONS))
                else:
                    self.topics[t.name] = t.num_partitions
                    out.append(pb.CreatableTopicResult(name=t.name))
        return pb.CreateTopicsResponse(topics=out)

    def FindCoordinator(self, request, context):
        self.calls["FindCoordinator"] += 1
        if self.find_faults:
            return pb.FindCoordinatorResponse(error_code=self.find_faults.popleft())
        return pb.FindCoordinatorResponse(node_id="n1", host="127.0.0.1", port=self.port)

    # ---------------------------------------------------------------- PartitionLeader
    def Produce(self, request, context):
        self.produce_delay.wait(10)
        with self.lock:
            hold, self.hold_next_produce = self.hold_next_produce, None
        if hold is not None:
            hold.wait(10)
        self.calls["Produce"] += 1
        with self.lock:
            self.produce_requests.append(request)
            out = []
            for t in request.topics:
                parts = []
                for pd in t.partitions:
                    code, base = self._produce_one(t.name, pd.partition, bytes(pd.records), request.transactional_id,
                                                   request.add_partitions_to_txn)
                    parts.append(pb.PartitionProduceResponse(partition=pd.partition, error_code=code,
                                                             base_offset=base, log_append_time_ms=-1))
                out.append(pb.TopicProduceResponse(name=t.name, partitions=parts))
        return pb.ProduceResponse(topics=out)

    def _produce_one(self, topic, partition, batch, tid, add=False):
        tp = (topic, partition)
        if topic not in self.topics or partition >= self.topics[topic]:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        for i, (ft, fp, code, write_anyway) in enumerate(self.produce_faults):
            if ft == topic and fp == partition:
                del self.produce_faults[i]
                if write_anyway:
                    self._produce_checked(tp, batch, tid, add)
                return code, -1
        return self._produce_checked(tp, batch, tid, add)

    def _produce_checked(self, tp, batch, tid, add=False):
        h = records.verify_crc(batch)
        if h.is_control:
            return ErrorCode.INVALID_REQUEST, -1
        if h.producer_id >= 0:
            cur = self.pid_epoch.get(h.producer_id)
            if cur is not None and h.producer_epoch < cur:
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1
        if h.is_transactional and add and tp not in self.txn_partitions[tid]:
            code = self._fence_check(tid, h.producer_id, h.producer_epoch)
            if code != ErrorCode.NONE:
                return ErrorCode.INVALID_PRODUCER_EPOCH if code == ErrorCode.PRODUCER_FENCED \
                    else ErrorCode.INVALID_TXN_STATE, -1
            self.calls["implicit add"] += 1
            self.txn_partitions[tid].add(tp)
        if h.is_transactional:
            if tid not in self.txn_ids or tp not in self.txn_partitions[tid]:
                return ErrorCode.INVALID_TXN_STATE, -1
        if h.producer_id >= 0:
            hist = self.producer_batches[(h.producer_id, h.producer_epoch, tp)]
            for first, last, base in hist:
                if first == h.base_sequence and last == h.last_sequence:
                    return ErrorCode.DUPLICATE_SEQUENCE_NUMBER, base
            expected = hist[-1][1] + 1 if hist else 0
            if h.base_sequence != expected:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        base = self.next_offset[tp]
        buf = bytearray(batch)
        records.set_base_offset(buf, base)
        self.logs[tp].append(bytes(buf))
        self.next_offset[tp] = base + h.record_count
        if h.producer_id >= 0:
            hist = self.producer_batches[(h.producer_id, h.producer_epoch, tp)]
            hist.append((h.base_sequence, h.last_sequence, base))
            del hist[:-5]
        return ErrorCode.NONE, base

    def ListOffsets(self, request, context):
        with self.lock:
            return pb.ListOffsetsResponse(topics=[pb.ListOffsetsTopicResponse(name=t.name, partitions=[
                pb.ListOffsetsPartitionResponse(partition=p.partition, offset=self.next_offset[(t.name, p.partition)])
                for p in t.partitions]) for t in request.topics])

    def records(self, topic, partition):
        """Decoded (offset, key, value, header) of the partition's log."""
        out = []
        with self.lock:
            for b in self.logs[(topic, partition)]:
                h = records.parse_header(b)
                out.extend((r, h) for r in records.decode_records(b, 0, h))
        return out

    # ---------------------------------------------------------------- TransactionCoordinator
    def _fence_check(self, tid, pid, epoch):
        cur = self.txn_ids.get(tid)
        if cur is None or cur != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch < self.pid_epoch[pid]:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.NONE

    def InitProducerId(self, request, context):
        self.calls["InitProducerId"] += 1
        with self.lock:
            self.init_requests.append(request)
            if self.init_faults:
                return pb.InitProducerIdResponse(error_code=self.init_faults.popleft())
            tid = request.transactional_id
            if not tid:
                pid = self.next_pid
                self.next_pid += 1
                self.pid_epoch[pid] = 0
                return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=0)
            pid = self.txn_ids.get(tid)
            if pid is None:
                pid = self.next_pid
                self.next_pid += 1
                self.txn_ids[tid] = pid
                self.pid_epoch[pid] = 0
            else:
                if self.txn_partitions[tid] or self.txn_groups[tid]:
                    self.ended.append((tid, False, frozenset(self.txn_partitions[tid])))
                    self.txn_partitions[tid].clear()
                    self.txn_groups[tid].clear()
                self.pid_epoch[pid] += 1
            return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=self.pid_epoch[pid])

    def AddPartitionsToTxn(self, request, context):
        self.calls["AddPartitionsToTxn"] += 1
        with self.lock:
            self.add_partitions_requests.append(request)
            code = self.add_partitions_faults.popleft() if self.add_partitions_faults else \
                self._fence_check(request.transactional_id, request.producer_id, request.producer_epoch)
            if code == ErrorCode.NONE:
                for t in request.topics:
                    for p in t.partitions:
                        self.txn_partitions[request.transactional_id].add((t.topic, p))
            return pb.AddPartitionsToTxnResponse(results=[pb.TopicResult(topic=t.topic, partitions=[
                pb.PartitionResult(partition=p, error_code=code) for p in t.partitions]) for t in request.topics])

    def AddOffsetsToTxn(self, request, context):
        self.calls["AddOffsetsToTxn"] += 1
        with self.lock:
            code = self._fence_check(request.transactional_id, request.producer_id, request.producer_epoch)
            if code == ErrorCode.NONE:
                self.txn_groups[request.transactional_id].add(request.group_id)
            return pb.AddOffsetsToTxnResponse(error_code=code)

    def EndTxn(self, request, context):
        self.calls["EndTxn"] += 1
        with self.lock:
            tid = request.transactional_id
            code = self.end_txn_faults.popleft() if self.end_txn_faults else \
                self._fence_check(tid, request.producer_id, request.producer_epoch)
            if code == ErrorCode.NONE and self.strict_end_txn and not (self.txn_partitions[tid] or
                                                                         self.txn_groups[tid]):
                code = ErrorCode.INVALID_TXN_STATE
            if code == ErrorCode.NONE:
                self.ended.append((tid, request.committed, frozenset(self.txn_partitions[tid])))
                for group in self.txn_groups[tid]:
                    pending = self.pending_offsets.pop((tid, group), {})
                    if request.committed:
                        self.committed_offsets[group].update(pending)
                self.txn_partitions[tid].clear()
                self.txn_groups[tid].clear()
                # KIP-890 part 2: the transaction ends under the next epoch.
                self.pid_epoch[request.producer_id] = request.producer_epoch + 1
                return pb.EndTxnResponse(error_code=code, producer_id=request.producer_id,
                                         producer_epoch=request.producer_epoch + 1)
            return pb.EndTxnResponse(error_code=code)

    # ---------------------------------------------------------------- GroupCoordinator
    def TxnOffsetCommit(self, request, context):
        self.calls["TxnOffsetCommit"] += 1
        with self.lock:
            code = ErrorCode.NONE
            pid = self.txn_ids.get(request.transactional_id)
            if pid != request.producer_id or request.producer_epoch < self.pid_epoch.get(pid, 0):
                code = ErrorCode.PRODUCER_FENCED
            elif request.group_id not in self.txn_groups[request.transactional_id]:
                code = ErrorCode.INVALID_TXN_STATE
            elif request.generation_id >= 0 and request.group_id in self.group_generation \
                    and request.generation_id != self.group_generation[request.group_id]:
                code = ErrorCode.ILLEGAL_GENERATION
            if code == ErrorCode.NONE:
                pending = self.pending_offsets.setdefault((request.transactional_id, request.group_id), {})
                for t in request.topics:
                    for p in t.partitions:
                        pending[(t.name, p.partition)] = p.committed_offset
            self.last_txn_offset_commit = request
            return pb.TxnOffsetCommitResponse(topics=[pb.TopicResult(topic=t.name, partitions=[
                pb.PartitionResult(partition=p.partition, error_code=code) for p in t.partitions])
                for t in request.topics])
