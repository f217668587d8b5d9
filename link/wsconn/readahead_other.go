//go:build !unix

package wsconn

// readAheadOS is false where the read-ahead's non-waiting read is not
// written: connections read as they did without it.
const readAheadOS = false

func (ra *readAhead) readNow(p []byte) (int, bool, error) { return 0, false, nil }

func (rb *raBuf) readFD(uintptr) bool { return true }

func (ra *readAhead) fill(bool) (bool, error) { return ra.fillBlocking() }
