"""The read buffer of archive serving: reused while no view of it is alive, replaced while one is."""

from __future__ import annotations

from proxy.storage.read_buffer import ReadBuffer, exported


def test_a_buffer_without_views_is_handed_out_again():
    buffers = ReadBuffer(1024)
    first = buffers.take()
    view = memoryview(first)[:10]
    del view
    assert buffers.take() is first
    assert buffers.allocations == 1
    assert len(first) == 1024


def test_a_live_slice_of_a_view_keeps_the_buffer_from_being_reused():
    buffers = ReadBuffer(1024)
    first = buffers.take()
    first[:3] = b"abc"
    full = memoryview(first)
    kept = full[:3]
    full.release()  # the slice alone still holds the buffer
    second = buffers.take()
    assert second is not first and buffers.allocations == 2
    second[:3] = b"xyz"
    assert bytes(kept) == b"abc"  # what a transport still holds is never overwritten
    kept.release()
    assert buffers.take() is second


def test_exported_says_whether_a_view_is_alive_and_leaves_the_buffer_as_it_was():
    buffer = bytearray(b"0123")
    assert not exported(buffer)
    assert buffer == b"0123"
    with memoryview(buffer):
        assert exported(buffer)
    assert not exported(buffer)
    assert buffer == b"0123"
