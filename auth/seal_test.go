package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/auth"
)

func TestSealer(t *testing.T) {
	k1 := auth.Key{Secret: []byte(strings.Repeat("1", 32))}
	k2 := auth.Key{ID: "next", Secret: []byte(strings.Repeat("2", 32))}
	s, err := auth.NewSealer([]auth.Key{k1})
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("/agentmesh/instances/a\x00{}")
	seal := s.Seal(msg)
	if !s.Open(msg, seal) {
		t.Fatal("a seal does not open its own message")
	}
	for _, bad := range []string{"", seal + "x", strings.Replace(seal, ".", "", 1), "nokid." + strings.SplitN(seal, ".", 2)[1], strings.Repeat("a", 200)} {
		if s.Open(msg, bad) {
			t.Errorf("Open accepted the seal %q", bad)
		}
	}
	if s.Open([]byte("/agentmesh/instances/b\x00{}"), seal) {
		t.Error("a seal opened another message")
	}
	// Rotation: both keys open, the first seals.
	if err := s.SetKeys([]auth.Key{k2, k1}); err != nil {
		t.Fatal(err)
	}
	if !s.Open(msg, seal) {
		t.Error("the old key's seal no longer opens while the key is in the set")
	}
	if got := auth.SealedBy(s.Seal(msg)); got != auth.KeyID(k2.Secret) {
		t.Errorf("sealed by %q; want the first key, %q", got, auth.KeyID(k2.Secret))
	}
	if err := s.SetKeys([]auth.Key{k2}); err != nil {
		t.Fatal(err)
	}
	if s.Open(msg, seal) {
		t.Error("a seal of a dropped key still opens")
	}
	if err := s.SetKeys([]auth.Key{{Secret: []byte("short")}}); err == nil {
		t.Error("a short key was accepted")
	}
	// A seal is not a token signature, nor the reverse: the seal's key is
	// derived for that purpose alone.
	tok, err := auth.Issue(k2.Secret, auth.Claims{Subject: "x"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tok, ".")
	if s.Open([]byte(parts[0]+"."+parts[1]), auth.KeyID(k2.Secret)+"."+parts[2]) {
		t.Error("a token's signature opens as a seal")
	}
}
