package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// maxKeyFile bounds a key file: anything larger is not a key.
const maxKeyFile = 4 << 10

// LoadKey reads the HMAC key in path.
//
// Format: if the file, without surrounding white space, is valid base64
// (standard or URL alphabet, padded or not) that decodes to at least
// MinKeyLen bytes, the key is the decoded bytes (what NewKeyFile writes);
// otherwise the key is the file's bytes exactly as they are. Either way it
// must be at least MinKeyLen bytes, and the file at most 4 KiB.
//
// Permissions: on Unix the file must not be accessible to "other" users
// at all and not writable by its group (mode & 0o027 == 0); 0600, 0400,
// 0640 and 0440 pass, 0644 does not. The error says how to fix it
// (chmod 600; Kubernetes secret volumes: defaultMode 0400, optionally
// with fsGroup for 0440). The mode checked is that of the file a symlink
// points to, which is what Kubernetes mounts.
func LoadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth: key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("auth: key file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o027 != 0 {
		return nil, fmt.Errorf("auth: key file %s has mode %04o: it must not be readable by other users or writable by its group; run chmod 600 %s (Kubernetes: defaultMode: 0400)", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("auth: key file: %w", err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("auth: key file %s is larger than %d bytes; it is not a key", path, maxKeyFile)
	}
	key := ParseKey(data)
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("auth: key file %s holds a %d-byte key; want at least %d (meshctl token keygen makes one)", path, len(key), MinKeyLen)
	}
	return key, nil
}

// ParseKey applies LoadKey's format rule to data without the file checks:
// decoded base64 when data is base64 of at least MinKeyLen bytes, else data.
func ParseKey(data []byte) []byte {
	text := bytes.TrimSpace(data)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		k, err := enc.Strict().DecodeString(string(text))
		if err == nil && len(k) >= MinKeyLen {
			return k
		}
	}
	return data
}

// NewKeyFile writes a new random 32-byte key to path as base64 text with
// mode 0600 and returns it. It refuses to overwrite an existing file.
func NewKeyFile(path string) ([]byte, error) {
	key := make([]byte, MinKeyLen)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("auth: %s exists; not overwriting a key", path)
		}
		return nil, fmt.Errorf("auth: %w", err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("auth: writing key: %w", err)
	}
	return key, nil
}
