package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
)

// Sealer seals records that the mesh's hubs write where others can write
// too (the etcd registry): a seal is an HMAC of the record made with a key
// that only hubs hold, so a record without a valid seal was not written by
// a hub of this mesh. Agents and clients hold tokens, never keys, and so
// cannot seal.
//
// The first key of the set seals; every key opens (rotation: add the new
// key to every hub, make it first, then drop the old one). A seal is
// "KID.MAC" with MAC the unpadded base64url HMAC-SHA256 of the message
// under a key derived from the secret for this purpose alone, so that a
// seal is never a valid token signature or the reverse. Safe for
// concurrent use.
type Sealer struct {
	set atomic.Pointer[sealKeys]
}

type sealKeys struct {
	first string            // kid of the sealing key
	byID  map[string][]byte // kid (KeyID and label) -> derived key
}

// sealDomain separates the seal's key from the token key it derives from.
const sealDomain = "agentmesh registry seal v1"

// NewSealer returns a sealer over keys (as Verifier.SetKeys checks them).
func NewSealer(keys []Key) (*Sealer, error) {
	s := &Sealer{}
	if err := s.SetKeys(keys); err != nil {
		return nil, err
	}
	return s, nil
}

// SetKeys replaces the sealer's keys atomically; on error it keeps the
// current ones.
func (s *Sealer) SetKeys(keys []Key) error {
	if len(keys) == 0 {
		return errors.New("auth: no key")
	}
	set := &sealKeys{byID: map[string][]byte{}}
	for i, k := range keys {
		if len(k.Secret) < MinKeyLen {
			return errors.New("auth: a key is shorter than the minimum")
		}
		mac := hmac.New(sha256.New, k.Secret)
		mac.Write([]byte(sealDomain))
		derived := mac.Sum(nil)
		ids := []string{KeyID(k.Secret)}
		if k.ID != "" {
			if !validKID(k.ID) {
				return errors.New("auth: malformed key id " + k.ID)
			}
			ids = append(ids, k.ID)
		}
		for _, id := range ids {
			if old, dup := set.byID[id]; dup && !hmac.Equal(old, derived) {
				return errors.New("auth: key id " + id + " names two different keys")
			}
			set.byID[id] = derived
		}
		if i == 0 {
			set.first = ids[0]
		}
	}
	s.set.Store(set)
	return nil
}

// Seal returns the seal of msg under the first key.
func (s *Sealer) Seal(msg []byte) string {
	set := s.set.Load()
	return set.first + "." + sealMAC(set.byID[set.first], msg)
}

// Open reports whether seal is a seal of msg under one of the keys.
func (s *Sealer) Open(msg []byte, seal string) bool {
	kid, mac, ok := strings.Cut(seal, ".")
	if !ok || len(seal) > 128 {
		return false
	}
	key := s.set.Load().byID[kid]
	if key == nil {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(sealMAC(key, msg)))
}

// Knows reports whether seal names a key of the set (whether or not it
// opens a given message): a seal of an unknown key may be another hub's
// during a rotation, one of a known key that does not open is forged or
// moved.
func (s *Sealer) Knows(seal string) bool {
	kid, _, _ := strings.Cut(seal, ".")
	return s.set.Load().byID[kid] != nil
}

// SealedBy returns the id of the key that made seal (its kid), for a
// writer that re-seals what an old key sealed.
func SealedBy(seal string) string {
	kid, _, _ := strings.Cut(seal, ".")
	return kid
}

// First returns the id of the sealing key.
func (s *Sealer) First() string { return s.set.Load().first }

func sealMAC(key, msg []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(msg)
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
