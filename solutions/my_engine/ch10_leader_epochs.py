"""Chapter 10 — Leader epochs and elections: my passing functions (end_offset_for, truncation_offset, elect_leader).

Written by kstore.my_engine.save("ex10"); a new save replaces this file.
"""

SAVED = ('end_offset_for', 'truncation_offset', 'elect_leader')    # the functions whose tests passed: the engine plugs in these


def end_offset_for(entries, requested_epoch, log_end_offset):
    if requested_epoch == -1:
        return -1, -1
    if entries and requested_epoch == entries[-1][0]:
        return requested_epoch, log_end_offset
    higher = [start for epoch, start in entries if epoch > requested_epoch]
    if not higher:
        return -1, -1
    lower = [epoch for epoch, _ in entries if epoch <= requested_epoch]
    return (lower[-1] if lower else requested_epoch), higher[0]


def truncation_offset(leader_epoch, leader_end_offset, own_end_offset_for_epoch, log_end_offset,
                      high_watermark):
    if leader_end_offset == -1:
        return high_watermark, True
    if leader_epoch == -1:
        return min(leader_end_offset, log_end_offset), True
    if own_end_offset_for_epoch is None or own_end_offset_for_epoch[0] == -1:
        return min(leader_end_offset, log_end_offset), True
    own_epoch, own_end = own_end_offset_for_epoch
    if own_epoch != leader_epoch:
        return min(own_end, log_end_offset), False
    return min(leader_end_offset, own_end, log_end_offset), True


def elect_leader(assignment, isr, live, unclean_enabled):
    for broker in assignment:
        if broker in live and broker in isr:
            return (broker, "clean")
    if unclean_enabled:
        for broker in assignment:
            if broker in live:
                return (broker, "unclean")
    return (None, "offline")
