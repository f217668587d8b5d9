package envelope

import (
	"crypto/rand"
	"encoding/binary"
	"sync/atomic"
	"time"
)

// ids makes UUIDv7 values (RFC 9562) without a lock: 48 bits of unix
// milliseconds, then 74 bits made of a per-process random seed plus an
// atomic counter (RFC 9562 §6.2, method 2, "monotonic random"). Unlike
// google/uuid's NewV7 it takes no global mutex, so it is fit for the hot path.
var ids struct {
	randA uint16 // 12 random bits, fixed per process
	randB uint64 // 62 random bits, the counter's base
	ctr   atomic.Uint64
}

func init() {
	var b [10]byte
	_, _ = rand.Read(b[:])
	ids.randA = binary.BigEndian.Uint16(b[0:2]) & 0x0fff
	ids.randB = binary.BigEndian.Uint64(b[2:10])
}

const hexdigits = "0123456789abcdef"

// NewID returns a new UUIDv7 in its canonical 36-character form.
func NewID() string { return NewIDAt(time.Now()) }

// NewIDAt is NewID with its timestamp taken from now, a clock reading
// the caller already has (a call's start).
func NewIDAt(now time.Time) string {
	var u [16]byte
	ms := uint64(now.UnixMilli())
	u[0] = byte(ms >> 40)
	u[1] = byte(ms >> 32)
	u[2] = byte(ms >> 24)
	u[3] = byte(ms >> 16)
	u[4] = byte(ms >> 8)
	u[5] = byte(ms)
	binary.BigEndian.PutUint16(u[6:8], 0x7000|ids.randA)
	b := (ids.randB + ids.ctr.Add(1)) & (1<<62 - 1)
	binary.BigEndian.PutUint64(u[8:16], b|0x8000000000000000) // variant 10
	var s [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j] = hexdigits[c>>4]
		s[j+1] = hexdigits[c&0xf]
		j += 2
	}
	return string(s[:])
}
