package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentmesh/agentmesh/registry"
)

// Nothing read from etcd is trusted until it is checked: anyone who can
// write under the prefix (an agent's host, another tenant, a mistake)
// could otherwise point every hub at an address of their choosing. A
// record is accepted only if
//   - its id is its key's (never the value's), and the key is well formed;
//   - it is at most MaxRecordBytes and reads as the record it should be,
//     with valid capabilities, state, heartbeat and address;
//   - with a Sealer, it carries a valid seal made for that key;
//   - an instance's hub is present, with the same lease as the instance's
//     record (only that hub's session writes under it), and the address
//     peers reach the instance at is the one in the hub's presence;
//   - the per-hub and total bounds are not exceeded.
// Anything else is skipped, logged once per key, and counted.

// Defaults of Config's bounds.
const (
	DefaultMaxRecordBytes     = 96 << 10
	DefaultMaxInstancesPerHub = 20_000
	DefaultMaxInstances       = 200_000
	maxHubRecordBytes         = 4 << 10
	maxWarnedKeys             = 4096 // keys whose refusal is remembered (logged once)
	maxHeartbeatMs            = int64(time.Hour / time.Millisecond)
)

// Reasons a record is refused (the reason label of
// agentmesh_registry_invalid_records_total).
const (
	ReasonBadKey         = "bad_key"          // the key's id is empty, too long or not printable
	ReasonUnknownKey     = "unknown_key"      // under the prefix, but neither hubs/ nor instances/
	ReasonTooLarge       = "too_large"        // over MaxRecordBytes
	ReasonUnsealed       = "unsealed"         // no seal, with a Sealer configured
	ReasonBadSeal        = "bad_seal"         // a seal of a known key that does not open: forged, or moved to another key or lease
	ReasonUnknownSealKey = "unknown_seal_key" // a seal of a key this hub does not hold (a rotation under way, or another mesh)
	ReasonJSON           = "json"             // not the JSON of a record
	ReasonIDMismatch     = "id_mismatch"      // the value names another id than its key
	ReasonSchema         = "schema"           // a field out of its bounds (capabilities, state, heartbeat, address, epoch)
	ReasonNoHub          = "no_hub"           // an instance whose hub is not present
	ReasonNotOwner       = "not_owner"        // an instance not under its hub's lease, or at another address
	ReasonNoLease        = "no_lease"         // a presence without a lease: it would never leave
	ReasonOverLimit      = "over_limit"       // past MaxInstancesPerHub or MaxInstances
	ReasonNotOurs        = "not_ours"         // this hub's own presence, written by someone else
)

// Reasons lists every reason a record can be refused for, so that a
// metric can show each at 0 before the first refusal.
var Reasons = []string{ReasonBadKey, ReasonUnknownKey, ReasonTooLarge, ReasonUnsealed, ReasonBadSeal, ReasonUnknownSealKey, ReasonJSON,
	ReasonIDMismatch, ReasonSchema, ReasonNoHub, ReasonNotOwner, ReasonNoLease, ReasonOverLimit, ReasonNotOurs}

// RecordSealer seals and opens records (auth.Sealer).
type RecordSealer interface {
	Seal(msg []byte) string
	Open(msg []byte, seal string) bool
	Knows(seal string) bool // seal names one of the keys
}

// sealMember is how the seal ends a sealed record: it is the record's
// last member, and the seal covers the exact bytes before it (with the
// closing brace), so that no re-encoding is needed to check it.
var sealMember = []byte(`,"seal":"`)

// sealMessage is what a seal covers: the etcd key, the lease the record
// is written under, and the record. The lease binds a record to the
// session that wrote it: a record sealed once cannot be put back later
// (a previous life's, or an older state of this one) under another
// lease, and one replayed under the same lease dies with it.
func sealMessage(key string, lease int64, body []byte) []byte {
	msg := make([]byte, 0, len(key)+22+len(body))
	msg = append(msg, key...)
	msg = append(msg, 0)
	msg = strconv.AppendInt(msg, lease, 16)
	msg = append(msg, 0)
	return append(msg, body...)
}

// encode is v's JSON, sealed for key when there is a Sealer.
func (r *Registry) encode(key string, lease clientv3.LeaseID, v any) string {
	b, _ := json.Marshal(v)
	if r.cfg.Sealer == nil || len(b) < 2 {
		return string(b)
	}
	seal := r.cfg.Sealer.Seal(sealMessage(key, int64(lease), b))
	out := make([]byte, 0, len(b)+len(sealMember)+len(seal)+2)
	out = append(out, b[:len(b)-1]...)
	out = append(out, sealMember...)
	out = append(out, seal...)
	return string(append(out, '"', '}'))
}

// unseal returns the record under key without its seal, or why it is
// refused. Without a Sealer it returns v as it is.
func (r *Registry) unseal(key string, lease int64, v []byte) ([]byte, string) {
	if r.cfg.Sealer == nil {
		return v, ""
	}
	i := bytes.LastIndex(v, sealMember)
	if i < 1 || !bytes.HasSuffix(v, []byte(`"}`)) {
		return nil, ReasonUnsealed
	}
	seal := v[i+len(sealMember) : len(v)-2]
	body := append(v[:i:i], '}') // a copy: cap is i
	if !r.cfg.Sealer.Open(sealMessage(key, lease, body), string(seal)) {
		if !r.cfg.Sealer.Knows(string(seal)) {
			return nil, ReasonUnknownSealKey
		}
		return nil, ReasonBadSeal
	}
	return body, ""
}

// validID checks an id taken from a key: 1 to 256 printable bytes of
// valid UTF-8, no space or '/'.
func validID(s string) bool {
	if s == "" || len(s) > 256 || !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '/' {
			return false
		}
	}
	return true
}

// validAddr checks a hub's address: host:port, port 1-65535, host a name
// or IP of at most 253 bytes.
func validAddr(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || len(host) > 253 {
		return false
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return false
	}
	if net.ParseIP(host) != nil {
		return true
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// refuseLocked counts a refused record, and logs it once per key and
// reason (the first maxWarnedKeys keys; past them only the count grows).
func (r *Registry) refuseLocked(key, reason, detail string) {
	if r.cfg.OnInvalid != nil {
		r.cfg.OnInvalid(reason)
	}
	if len(key) > 512 {
		// Remembered and logged by a bounded form: a key may be
		// megabytes long.
		key = key[:512] + "…(" + strconv.Itoa(len(key)) + " bytes)"
	}
	if r.warned[key] == reason {
		return
	}
	if len(r.warned) >= maxWarnedKeys {
		if _, ok := r.warned[""]; !ok {
			r.warned[""] = "full"
			r.log.Warn("etcd registry: more records refused than are logged one by one; see agentmesh_registry_invalid_records_total", "logged", maxWarnedKeys)
		}
		return
	}
	r.warned[key] = reason
	r.log.Warn("etcd registry: record refused", "key", key, "reason", reason, "detail", detail)
}

// acceptedLocked forgets that key was refused, so that a later refusal
// is logged again.
func (r *Registry) acceptedLocked(key string) {
	if len(r.warned) > 0 {
		delete(r.warned, key)
	}
}

// parseHub checks the presence under hubs/<id>. The id is the key's.
func (r *Registry) parseHub(id string, kv *mvccpb.KeyValue) (hubState, bool) {
	key := string(kv.Key)
	if !validID(id) {
		r.refuseLocked(key, ReasonBadKey, "hub id")
		return hubState{}, false
	}
	if len(kv.Value) > maxHubRecordBytes {
		r.refuseLocked(key, ReasonTooLarge, strconv.Itoa(len(kv.Value))+" bytes")
		return hubState{}, false
	}
	body, why := r.unseal(key, kv.Lease, kv.Value)
	if why != "" {
		r.refuseLocked(key, why, "")
		return hubState{}, false
	}
	var h hubRecord
	if err := json.Unmarshal(body, &h); err != nil {
		r.refuseLocked(key, ReasonJSON, err.Error())
		return hubState{}, false
	}
	switch {
	case h.ID != id:
		r.refuseLocked(key, ReasonIDMismatch, "the record names hub "+strconv.Quote(h.ID))
		return hubState{}, false
	case h.Epoch == "" || len(h.Epoch) > 128:
		r.refuseLocked(key, ReasonSchema, "epoch")
		return hubState{}, false
	case h.Addr != "" && !validAddr(h.Addr):
		r.refuseLocked(key, ReasonSchema, "address "+strconv.Quote(h.Addr))
		return hubState{}, false
	case kv.Lease == 0:
		r.refuseLocked(key, ReasonNoLease, "")
		return hubState{}, false
	}
	r.acceptedLocked(key)
	return hubState{epoch: h.Epoch, addr: h.Addr, lease: kv.Lease}, true
}

// parseInstance checks the record under instances/<id> and returns it
// with its owner; see the list at the top of this file.
func (r *Registry) parseInstance(id string, kv *mvccpb.KeyValue) (record, owner, string) {
	key := string(kv.Key)
	refuse := func(reason, detail string) (record, owner, string) {
		r.refuseLocked(key, reason, detail)
		return record{}, owner{}, reason
	}
	if !validID(id) {
		return refuse(ReasonBadKey, "instance id")
	}
	if len(kv.Value) > r.cfg.MaxRecordBytes {
		return refuse(ReasonTooLarge, strconv.Itoa(len(kv.Value))+" bytes")
	}
	body, why := r.unseal(key, kv.Lease, kv.Value)
	if why != "" {
		return refuse(why, "")
	}
	var rec record
	if err := json.Unmarshal(body, &rec); err != nil {
		return refuse(ReasonJSON, err.Error())
	}
	if rec.InstanceID != id {
		return refuse(ReasonIDMismatch, "the record names instance "+strconv.Quote(rec.InstanceID))
	}
	if rec.HeartbeatMs <= 0 || rec.HeartbeatMs > maxHeartbeatMs {
		return refuse(ReasonSchema, "heartbeatMs "+strconv.FormatInt(rec.HeartbeatMs, 10))
	}
	rec.HeartbeatInterval = time.Duration(rec.HeartbeatMs) * time.Millisecond
	if err := rec.Validate(); err != nil {
		return refuse(ReasonSchema, err.Error())
	}
	if !validID(rec.Hub) || len(rec.Name) > 256 || len(rec.Capabilities) > 1024 || len(rec.Intents) > 1024 ||
		!registry.ValidState(rec.State) || rec.HubEpoch == "" || len(rec.HubEpoch) > 128 {
		return refuse(ReasonSchema, "hub, name, state, epoch or list lengths")
	}
	o := owner{epoch: rec.HubEpoch, lease: kv.Lease}
	if rec.Hub == r.cfg.Hub {
		// Ours: this life's write coming back, or a previous life's
		// left-over (not routable; it goes with its old lease). Those
		// not attached here count towards the total bound.
		if r.local[id] == nil && r.pending[id] == 0 && r.insts[id] == nil && len(r.insts)-len(r.local) >= r.cfg.MaxInstances {
			return refuse(ReasonOverLimit, strconv.Itoa(len(r.insts))+" instances")
		}
		r.acceptedLocked(key)
		return rec, o, ""
	}
	h := r.hubs[rec.Hub]
	switch {
	case h.epoch == "":
		return refuse(ReasonNoHub, "hub "+strconv.Quote(rec.Hub)+" is not present")
	case kv.Lease != h.lease:
		return refuse(ReasonNotOwner, "not under the lease of hub "+strconv.Quote(rec.Hub))
	case rec.HubAddr != "" && rec.HubAddr != h.addr:
		return refuse(ReasonNotOwner, "address "+strconv.Quote(rec.HubAddr)+" is not hub "+strconv.Quote(rec.Hub)+"'s")
	}
	rec.HubAddr = h.addr // where the hub itself says it is
	if old := r.insts[id]; old == nil || old.Hub != rec.Hub {
		switch {
		case len(r.byHub[rec.Hub]) >= r.cfg.MaxInstancesPerHub:
			return refuse(ReasonOverLimit, "hub "+strconv.Quote(rec.Hub)+" has "+strconv.Itoa(len(r.byHub[rec.Hub]))+" instances")
		case len(r.insts)-len(r.local) >= r.cfg.MaxInstances:
			return refuse(ReasonOverLimit, strconv.Itoa(len(r.insts))+" instances")
		}
	}
	r.acceptedLocked(key)
	return rec, o, ""
}

// ownerless reports whether a record refused for reason cannot have been
// written where it is by a hub of this mesh (so that the hub whose
// agent's key it overwrote writes its own back). A record refused for a
// bound or for a hub not yet seen may be another hub's: it is left
// alone. (A seal of a key this hub does not hold is not a hub's either:
// a rotation adds the new key to every hub before any seals with it.)
func ownerless(reason string) bool {
	switch reason {
	case ReasonUnsealed, ReasonBadSeal, ReasonUnknownSealKey, ReasonJSON, ReasonIDMismatch, ReasonSchema, ReasonTooLarge, ReasonNotOwner, ReasonBadKey:
		return true
	}
	return false
}

// ourPresenceEventLocked handles a watch event on this hub's own
// presence key: if it is not this process's record any more (deleted or
// overwritten by someone else while the session holds), it is written
// again.
func (r *Registry) ourPresenceEventLocked(ev *clientv3.Event) {
	if ev.Type == clientv3.EventTypeDelete {
		r.ourPresenceChangedLocked(0, true)
		return
	}
	if r.isOurPresence(ev.Kv) {
		return
	}
	r.refuseLocked(string(ev.Kv.Key), ReasonNotOurs, "this hub's presence, written by someone else")
	r.ourPresenceChangedLocked(ev.Kv.ModRevision, false)
}

// ourPresenceChangedLocked schedules this hub's presence to be written
// again, if it has a session (without one, the next session writes it).
func (r *Registry) ourPresenceChangedLocked(rev int64, deleted bool) {
	if r.session == 0 || r.closed {
		return
	}
	if deleted {
		rev = 0
	}
	r.repairLocked(r.hubsP+r.cfg.Hub, rev)
}

// isOurPresence reports whether v is this process's presence record
// (its epoch; sealed, when there is a Sealer).
func (r *Registry) isOurPresence(kv *mvccpb.KeyValue) bool {
	body, why := r.unseal(r.hubsP+r.cfg.Hub, kv.Lease, kv.Value)
	if why != "" {
		return false
	}
	var h hubRecord
	return json.Unmarshal(body, &h) == nil && h.ID == r.cfg.Hub && h.Epoch == r.epoch
}

// repairLocked schedules one of this hub's keys to be written again: the
// write happens only if the key is still as seen (modRev, or absent for
// 0), so that a legitimate owner's later write is never clobbered.
func (r *Registry) repairLocked(key string, modRev int64) {
	r.repairs[key] = modRev
	select {
	case r.repairC <- struct{}{}:
	default:
	}
}

// repair writes back this hub's keys that others overwrote or deleted.
func (r *Registry) repair() {
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.repairC:
		}
		r.mu.Lock()
		todo := r.repairs
		r.repairs = map[string]int64{}
		lease := r.session
		vals := make(map[string]string, len(todo))
		for key := range todo {
			if key == r.hubsP+r.cfg.Hub {
				vals[key] = r.presence(lease)
			} else if id, ok := strings.CutPrefix(key, r.prefix); ok && r.local[id] != nil {
				vals[key] = r.value(r.local[id], lease)
			}
		}
		r.mu.Unlock()
		if lease == 0 {
			continue // the next session writes everything
		}
		failed := false
		for key, val := range vals {
			cmp := clientv3.Compare(clientv3.ModRevision(key), "=", todo[key])
			if todo[key] == 0 {
				cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
			}
			ctx, cancel := context.WithTimeout(r.ctx, r.cfg.OpTimeout)
			res, err := r.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
			cancel()
			switch {
			case err != nil:
				if r.ctx.Err() != nil {
					return
				}
				r.log.Warn("etcd registry: cannot write back a key of this hub", "key", key, "error", err)
				r.mu.Lock()
				if _, again := r.repairs[key]; !again {
					r.repairs[key] = todo[key]
				}
				r.mu.Unlock()
				failed = true
			case res.Succeeded:
				r.log.Warn("etcd registry: a key of this hub was changed by someone else; written back", "key", key)
			}
		}
		if failed {
			if !sleep(r.ctx, 200*time.Millisecond) {
				return
			}
			select {
			case r.repairC <- struct{}{}:
			default:
			}
		}
	}
}

// Reseal writes this hub's presence and its agents' records again, sealed
// with the Sealer's current first key: after a key rotation (the new key
// known to every hub first, then made first), so that the old key can be
// dropped without the other hubs refusing this hub's records. Each write
// is conditional on the key still being this session's.
func (r *Registry) Reseal(ctx context.Context) error {
	r.mu.Lock()
	lease := r.session
	vals := map[string]string{r.hubsP + r.cfg.Hub: r.presence(lease)}
	for id, in := range r.local {
		vals[r.key(id)] = r.value(in, lease)
	}
	r.mu.Unlock()
	if lease == 0 {
		return nil // the next session writes everything, sealed anew
	}
	var errs []error
	for k, v := range vals {
		ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
		_, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(k), "=", lease)).
			Then(clientv3.OpPut(k, v, clientv3.WithLease(lease))).Commit()
		cancel()
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("etcd registry: reseal: %d of %d writes failed: %w", len(errs), len(vals), errors.Join(errs...))
	}
	return nil
}

// SetHub names the hub this registry writes for, and the address peers
// reach it at, when they were not known at New (a hub given a registry
// made before it listened: hub.New calls it). The records name this
// hub and its address whatever a registration says, so that the other
// hubs route to its agents only through its presence. It must come before
// the first Register; a presence already written under the old name is
// replaced.
func (r *Registry) SetHub(id, addr string) error {
	if !validID(id) {
		return fmt.Errorf("etcd registry: hub id %q: want 1 to 256 printable bytes without space or /", id)
	}
	if addr != "" && !validAddr(addr) {
		return fmt.Errorf("etcd registry: hub address %q: want host:port", addr)
	}
	r.mu.Lock()
	if id == r.cfg.Hub && addr == r.cfg.HubAddr {
		r.mu.Unlock()
		return nil
	}
	if len(r.local) > 0 || len(r.pending) > 0 {
		r.mu.Unlock()
		return errors.New("etcd registry: SetHub after agents registered")
	}
	oldKey := r.hubsP + r.cfg.Hub
	r.cfg.Hub, r.cfg.HubAddr = id, addr
	delete(r.hubs, id) // this hub's own presence is not another's
	r.allDirty = true  // which instances are routable changed with the id
	lease := r.session
	val := r.presence(lease)
	r.mu.Unlock()
	if lease == 0 {
		return nil // the session writes the new presence when it starts
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.OpTimeout)
	defer cancel()
	put := clientv3.OpPut(r.hubsP+id, val, clientv3.WithLease(lease))
	var err error
	if oldKey == r.hubsP+id {
		// The same id, a new address (a registry made with the hub's id,
		// before it listened, its session already running): a txn may
		// not touch one key twice, so no delete.
		_, err = r.cli.Put(ctx, r.hubsP+id, val, clientv3.WithLease(lease))
	} else {
		_, err = r.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(oldKey), "=", lease)).
			Then(clientv3.OpDelete(oldKey), put).Else(put).Commit()
	}
	if err != nil {
		return fmt.Errorf("etcd registry: writing the presence of hub %s: %w", id, err)
	}
	return nil
}
