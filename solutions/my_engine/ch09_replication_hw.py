"""Chapter 09 — Replication: LEO and the high watermark: my passing functions (leader_high_watermark, follower_high_watermark, is_caught_up, may_join_isr, classify_batch, acks_decision, read_committed).

Written by kstore.my_engine.save("ex09"); a new save replaces this file.
"""

ACKS_AT_ONCE = 'append, answer at once'
ACKS_INVALID = 'INVALID_REQUIRED_ACKS'
ACKS_NO_RESPONSE = 'append, no response'
ACKS_REFUSED = 'NOT_ENOUGH_REPLICAS'
ACKS_WHEN_REPLICATED = 'append, answer when the ISR has it'

SAVED = ('leader_high_watermark', 'follower_high_watermark', 'is_caught_up', 'may_join_isr', 'classify_batch', 'acks_decision', 'read_committed')    # the functions whose tests passed: the engine plugs in these


def leader_high_watermark(leos, isr, min_insync_replicas):
    if len(isr) < min(min_insync_replicas, len(leos)):
        return None
    return min(leos[b] for b in isr)


def follower_high_watermark(leader_hw, follower_leo):
    return min(leader_hw, follower_leo)


def is_caught_up(follower_leo, leader_leo, last_caught_up_ms, now, replica_lag_time_max_ms):
    return follower_leo == leader_leo or now - last_caught_up_ms <= replica_lag_time_max_ms


def may_join_isr(follower_leo, leader_hw, leader_epoch_start_offset):
    return follower_leo >= leader_hw and follower_leo >= leader_epoch_start_offset


def classify_batch(cached, current_epoch, producer_epoch, first_seq, last_seq):
    if cached is None:
        return "APPEND"                       # unknown producer: any sequence (KIP-360)
    if producer_epoch == current_epoch and any(
            first == first_seq and last == last_seq for first, last, _, _ in cached):
        return "DUPLICATE"
    if producer_epoch < current_epoch:
        return "INVALID_PRODUCER_EPOCH"
    if producer_epoch > current_epoch:
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    last = cached[-1][1]
    expected = 0 if last == 2**31 - 1 else last + 1
    return "APPEND" if first_seq == expected else "OUT_OF_ORDER_SEQUENCE_NUMBER"


def acks_decision(acks, isr_size, min_insync_replicas, replication_factor):
    if acks not in (0, 1, -1):
        return ACKS_INVALID
    if acks == 0:
        return ACKS_NO_RESPONSE
    if acks == 1:
        return ACKS_AT_ONCE
    if isr_size < min(min_insync_replicas, replication_factor):
        return ACKS_REFUSED
    return ACKS_WHEN_REPLICATED


def read_committed(batches, aborted):
    pending = sorted(aborted, key=lambda entry: entry[1])     # by first offset
    aborting = set()
    delivered = []
    for base, last, producer_id, kind in batches:
        if producer_id != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "abort":
                aborting.discard(producer_id)
            elif kind == "txn" and producer_id in aborting:
                continue
        if kind in ("data", "txn"):
            delivered.append(base)
    return delivered
