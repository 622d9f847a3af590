"""`exactly dump-log`: the batches of a segment file (kafka-dump-log), decoded with
the shared codec `exactly_wire.records` (docs/design.md, "Record batch v2, byte for
byte")."""
from __future__ import annotations

import json
import mmap
import pathlib

import click

from exactly_wire import records
from exactly_wire.compression import BY_NAME

from .common import json_option, options
from .clients import _text

_CODEC_NAME = {v: k for k, v in BY_NAME.items()}
_MARKER_NAME = {records.CONTROL_ABORT: "ABORT", records.CONTROL_COMMIT: "COMMIT"}


def describe_batch(buf, pos: int, h: records.BatchHeader, print_data: bool) -> dict:
    """One batch as a dict: header fields, CRC validity, marker type and coordinator
    epoch for a control batch, and with `print_data` its records."""
    try:
        records.verify_crc(buf, pos, h)
        valid = True
    except records.CorruptRecordError:
        valid = False
    out = {"base_offset": h.base_offset, "last_offset": h.last_offset, "count": h.record_count,
           "position": pos, "size": h.size, "partition_leader_epoch": h.partition_leader_epoch, "magic": h.magic,
           "crc": h.crc, "crc_valid": valid, "compression": _CODEC_NAME.get(h.compression, str(h.compression)),
           "timestamp_type": "LogAppendTime" if h.attributes & records.TIMESTAMP_TYPE_BIT else "CreateTime",
           "base_timestamp": h.base_timestamp, "max_timestamp": h.max_timestamp, "producer_id": h.producer_id,
           "producer_epoch": h.producer_epoch, "base_sequence": h.base_sequence,
           "is_transactional": h.is_transactional, "is_control": h.is_control}
    if not (h.is_control or print_data) or not valid:
        return out
    recs = records.decode_records(buf, pos, h)
    if h.is_control and recs:
        ctype, coordinator_epoch = records.decode_control_record(recs[0])
        out["marker"] = _MARKER_NAME.get(ctype, str(ctype))
        out["coordinator_epoch"] = coordinator_epoch
    if print_data:
        out["records"] = [{"offset": r.offset, "timestamp": r.timestamp, "key": _text(r.key), "value": _text(r.value),
                           "headers": {k: _text(v) for k, v in r.headers}} for r in recs]
    return out


def _line(b: dict) -> str:
    text = (f"baseOffset: {b['base_offset']} lastOffset: {b['last_offset']} count: {b['count']} "
            f"position: {b['position']} size: {b['size']} {b['timestamp_type']}: {b['max_timestamp']} "
            f"compresscodec: {b['compression']} crc: {b['crc']} isvalid: {str(b['crc_valid']).lower()} "
            f"producerId: {b['producer_id']} producerEpoch: {b['producer_epoch']} "
            f"baseSequence: {b['base_sequence']} isTransactional: {str(b['is_transactional']).lower()} "
            f"isControl: {str(b['is_control']).lower()} partitionLeaderEpoch: {b['partition_leader_epoch']}")
    if "marker" in b:
        text += f" endTxnMarker: {b['marker']} coordinatorEpoch: {b['coordinator_epoch']}"
    return text


@click.command("dump-log")
@click.argument("segment_file", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path))
@click.option("--print-data", is_flag=True, help="Also print every record (offset, timestamp, key, value, headers).")
@json_option
def dump_log(segment_file: pathlib.Path, print_data: bool) -> None:
    """Print the batches of a log segment (`<data dir>/logs/<topic>-<p>/<offset>.log`):
    offsets, producer id, epoch, base sequence, transactional and control flags,
    marker type and coordinator epoch of markers, CRC validity."""
    as_json = options().as_json
    with open(segment_file, "rb") as f:
        size = segment_file.stat().st_size
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        batches, end = [], 0
        try:
            for pos, h in records.iter_batches(buf):
                b = describe_batch(buf, pos, h, print_data)
                end = pos + h.size
                if as_json:
                    batches.append(b)
                    continue
                click.echo(_line(b))
                for r in b.get("records", ()):
                    if b["is_control"]:
                        click.echo(f"| offset: {r['offset']} CreateTime: {r['timestamp']} endTxnMarker: "
                                   f"{b['marker']} coordinatorEpoch: {b['coordinator_epoch']}")
                    else:
                        hdrs = ",".join(f"{k}={v}" for k, v in r["headers"].items())
                        click.echo(f"| offset: {r['offset']} CreateTime: {r['timestamp']} key: {r['key']} "
                                   f"headers: [{hdrs}] payload: {r['value']}")
        except records.CorruptRecordError as exc:
            raise click.ClickException(f"{segment_file}: unreadable batch at position {end}: {exc}") from None
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()
    if as_json:
        click.echo(json.dumps({"file": str(segment_file), "batches": batches, "valid_bytes": end,
                               "trailing_bytes": size - end}, indent=2))
    elif size - end:
        click.echo(f"{size - end} trailing bytes after the last whole batch", err=True)
