package auth_test

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/auth"
)

func writeFile(t *testing.T, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
	return p
}

func TestLoadKey(t *testing.T) {
	raw := bytes.Repeat([]byte{0xa5, 0x00, '\n', 0xff}, 10) // 40 binary bytes, not base64
	b64key := bytes.Repeat([]byte("k"), 32)
	for _, tc := range []struct {
		name string
		data []byte
		mode os.FileMode
		want []byte
		err  string
	}{
		{"base64 std with newline", []byte(base64.StdEncoding.EncodeToString(b64key) + "\n"), 0o600, b64key, ""},
		{"base64 raw url", []byte(base64.RawURLEncoding.EncodeToString(b64key)), 0o400, b64key, ""},
		{"raw binary kept exactly", raw, 0o600, raw, ""},
		{"raw text kept exactly", []byte("this is a long passphrase of more than 32 bytes\n"), 0o600, []byte("this is a long passphrase of more than 32 bytes\n"), ""},
		{"group-readable ok", []byte(base64.StdEncoding.EncodeToString(b64key)), 0o640, b64key, ""},
		{"world-readable refused", []byte(base64.StdEncoding.EncodeToString(b64key)), 0o644, nil, "chmod 600"},
		{"world-writable refused", []byte(base64.StdEncoding.EncodeToString(b64key)), 0o602, nil, "mode 0602"},
		{"group-writable refused", []byte(base64.StdEncoding.EncodeToString(b64key)), 0o660, nil, "mode 0660"},
		{"short raw", []byte("short"), 0o600, nil, "5-byte key"},
		{"short base64", []byte(base64.StdEncoding.EncodeToString(make([]byte, 16))), 0o600, nil, "want at least 32"},
		{"empty", nil, 0o600, nil, "0-byte key"},
		{"too large", bytes.Repeat([]byte("x"), 5000), 0o600, nil, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "key", tc.data, tc.mode)
			k, err := auth.LoadKey(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("LoadKey = %v; want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil || !bytes.Equal(k, tc.want) {
				t.Fatalf("LoadKey = %x, %v; want %x", k, err, tc.want)
			}
		})
	}
	if _, err := auth.LoadKey(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file loaded")
	}
	if _, err := auth.LoadKey(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	// A symlink (as Kubernetes mounts secrets) is judged by its target.
	target := writeFile(t, "key", []byte(base64.StdEncoding.EncodeToString(b64key)), 0o400)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if k, err := auth.LoadKey(link); err != nil || !bytes.Equal(k, b64key) {
		t.Errorf("symlink: %v", err)
	}
}

func TestNewKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mesh.key")
	k, err := auth.NewKeyFile(p)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %04o; want 0600", st.Mode().Perm())
	}
	if len(k) != 32 {
		t.Errorf("key is %d bytes", len(k))
	}
	loaded, err := auth.LoadKey(p)
	if err != nil || !bytes.Equal(loaded, k) {
		t.Fatalf("LoadKey of a new key file: %x, %v; want %x", loaded, err, k)
	}
	if _, err := auth.NewKeyFile(p); err == nil || !strings.Contains(err.Error(), "not overwriting") {
		t.Errorf("second NewKeyFile: %v", err)
	}
	if again, _ := auth.LoadKey(p); !bytes.Equal(again, k) {
		t.Error("the key changed")
	}
	k2, err := auth.NewKeyFile(filepath.Join(t.TempDir(), "other.key"))
	if err != nil || bytes.Equal(k2, k) {
		t.Errorf("two new keys equal or error %v", err)
	}
}
