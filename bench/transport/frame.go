package main

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The socket and pipe transports speak the request/response framing of the
// ZVFS path. A request and its answer carry the same op; an echo answer
// carries the request's payload back, a no-op answer has len 0.
//
//	0        4        8
//	+--------+--------+----------------------+
//	|   op   |  len   |  payload (len bytes) |
//	+--------+--------+----------------------+
//	 u32 LE   u32 LE
//
// Only one frame is ever in flight on a stream (the client waits for each
// answer), so a read that returns bytes beyond the frame is a protocol error.
const (
	frameHeaderLen = 8
	// maxFramePayload bounds the payload either side accepts.
	maxFramePayload = 64 << 10
	// frameBufLen is the size of a buffer that holds any valid frame.
	frameBufLen = frameHeaderLen + maxFramePayload
)

func putFrameHeader(b []byte, op, n uint32) {
	binary.LittleEndian.PutUint32(b[0:], op)
	binary.LittleEndian.PutUint32(b[4:], n)
}

// readFrame reads one frame into buf (at least frameBufLen bytes) and
// returns its op and payload, which aliases buf.
func readFrame(r io.Reader, buf []byte) (op uint32, payload []byte, err error) {
	got, err := io.ReadAtLeast(r, buf, frameHeaderLen)
	if err != nil {
		return 0, nil, err
	}
	op = binary.LittleEndian.Uint32(buf[0:])
	n := binary.LittleEndian.Uint32(buf[4:])
	if n > maxFramePayload || int(n) > len(buf)-frameHeaderLen {
		return 0, nil, fmt.Errorf("frame announces %d payload bytes, limit %d", n, maxFramePayload)
	}
	end := frameHeaderLen + int(n)
	if got > end {
		return 0, nil, fmt.Errorf("%d bytes arrived beyond a %d-byte frame", got-end, end)
	}
	if _, err := io.ReadFull(r, buf[got:end]); err != nil {
		return 0, nil, fmt.Errorf("frame payload: %w", err)
	}
	return op, buf[frameHeaderLen:end], nil
}
