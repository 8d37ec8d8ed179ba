package idem

import (
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// The record of an operation is one Redis string, in format 1:
//
//	1S|FENCE|OWNER|FINGERPRINT|CREATED|BODY
//
// 1 is the format version, S the state: P (in progress or released) or C
// (completed). FENCE is decimal, OWNER the token of the last claim,
// FINGERPRINT the request's, CREATED the Unix time in seconds of the first
// claim (the claiming client's clock, scriptCall.freshRecord; the server's
// before). BODY holds, for P, the checkpoints as netstring pairs
// (LEN:NAME LEN:VALUE ...), and for C the stored payload after a format byte
// (= as is, z deflated). The scripts in lua/ write and match it; this file is
// its Go side. A later format gets another version, so that records written
// before a deploy are still read after it; a reader refuses a format it does
// not know instead of misreading it.
const recordFormat = "1"

// recordFields are the fields of a stored record, unparsed.
type recordFields struct {
	state, fence, owner, fp, created, body string
}

// splitRecord splits a stored record into its fields, without copying.
func splitRecord(v string) (recordFields, error) {
	if !strings.HasPrefix(v, recordFormat) {
		return recordFields{}, errors.New("idem: unreadable record: unknown format")
	}
	var f [5]string
	for i := range f {
		j := strings.IndexByte(v, '|')
		if j < 0 {
			return recordFields{}, errors.New("idem: unreadable record: too few fields")
		}
		f[i], v = v[:j], v[j+1:]
	}
	return recordFields{state: f[0][1:], fence: f[1], owner: f[2], fp: f[3], created: f[4], body: v}, nil
}

// decodeRecord parses a stored record.
func decodeRecord(v string) (*idemstore.Record, error) {
	bad := func(why string) error { return fmt.Errorf("idem: unreadable record: %s", why) }
	f, err := splitRecord(v)
	if err != nil {
		return nil, err
	}
	r := &idemstore.Record{Owner: f.owner, Fingerprint: f.fp}
	if r.Fence, err = strconv.ParseInt(f.fence, 10, 64); err != nil || r.Fence < 1 {
		return nil, bad("fence " + strconv.Quote(f.fence))
	}
	created, err := strconv.ParseInt(f.created, 10, 64)
	if err != nil || created < 0 {
		return nil, bad("creation time " + strconv.Quote(f.created))
	}
	r.Created = time.Unix(created, 0)
	switch f.state {
	case "P":
		r.State = idemstore.StateInProgress
		if r.Checkpoints, err = decodeCheckpoints(f.body); err != nil {
			return nil, err
		}
	case "C":
		r.State = idemstore.StateCompleted
		if r.Payload, err = decodePayload(f.body); err != nil {
			return nil, err
		}
	default:
		return nil, bad("state " + strconv.Quote(f.state))
	}
	return r, nil
}

// parseClaim parses the reply of lua/claim.lua to the claim r: 1 for a
// fresh key claimed, a completed record as a bare string (the replay path,
// kept to one reply value), else an array.
func parseClaim(reply any, r idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	switch v := reply.(type) {
	case int64:
		if v != 1 {
			break
		}
		return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, nil
	case string:
		return parseCompleted(v, r)
	case []any:
		return parseClaimArray(v)
	}
	return idemstore.ClaimResult{}, fmt.Errorf("idem: unexpected claim reply %v", reply)
}

// parseCompleted parses a completed record that claim.lua returned whole,
// and compares its fingerprint with r's (ClaimRequest.MatchFingerprint, the
// rule the script applies to a record in progress). It refuses a header
// that format 1's pattern does not match, as the script does.
func parseCompleted(rec string, r idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	f, err := splitRecord(rec)
	switch {
	case err != nil:
		return idemstore.ClaimResult{}, err
	case f.state != "C":
		return idemstore.ClaimResult{}, errors.New("idem: unexpected claim reply: a record not completed")
	case !decimal(f.fence) || !decimal(f.created):
		return idemstore.ClaimResult{}, fmt.Errorf("idem: unreadable record: header %q", rec[:len(rec)-len(f.body)])
	}
	fence, _ := strconv.ParseInt(f.fence, 10, 64)
	switch st := r.MatchFingerprint(f.fp); st {
	case idemstore.ClaimMismatch:
		return idemstore.ClaimResult{Status: st, Fence: fence}, nil
	case idemstore.ClaimUnreadable:
		return idemstore.ClaimResult{Status: st}, nil
	}
	p, err := decodePayload(f.body)
	return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: fence, Payload: p}, err
}

// decimal reports whether s is one or more decimal digits, as Lua's %d+
// matches them.
func decimal(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parseClaimArray parses the array replies of lua/claim.lua.
func parseClaimArray(v []any) (idemstore.ClaimResult, error) {
	if len(v) == 0 {
		return idemstore.ClaimResult{}, fmt.Errorf("idem: unexpected claim reply %v", v)
	}
	status, _ := v[0].(int64)
	res := idemstore.ClaimResult{Status: idemstore.ClaimStatus(status)}
	switch {
	case res.Status == idemstore.ClaimOK && len(v) == 3:
		res.Fence, _ = v[1].(int64)
		cps, _ := v[2].(string)
		var err error
		if res.Checkpoints, err = decodeCheckpoints(cps); err != nil {
			return idemstore.ClaimResult{}, err
		}
	case res.Status == idemstore.ClaimBusy && len(v) == 2:
		ttl, _ := v[1].(int64)
		res.RetryAfter = time.Duration(max(ttl, 0)) * time.Millisecond
	case res.Status == idemstore.ClaimMismatch, res.Status == idemstore.ClaimUnreadable:
		if len(v) == 2 {
			res.Fence, _ = v[1].(int64)
		}
	default:
		return idemstore.ClaimResult{}, fmt.Errorf("idem: unexpected claim reply %v", v)
	}
	return res, nil
}

// decodeCheckpoints parses checkpoints stored as netstring pairs:
// LEN:NAME LEN:VALUE ... with later names replacing earlier ones.
func decodeCheckpoints(s string) (map[string][]byte, error) {
	if s == "" {
		return nil, nil
	}
	m := make(map[string][]byte)
	next := func() (string, error) {
		n, rest, ok := strings.Cut(s, ":")
		l, err := strconv.Atoi(n)
		if !ok || err != nil || l < 0 || l > len(rest) {
			return "", errors.New("idem: unreadable checkpoints")
		}
		s = rest[l:]
		return rest[:l], nil
	}
	for s != "" {
		name, err := next()
		if err != nil {
			return nil, err
		}
		value, err := next()
		if err != nil {
			return nil, err
		}
		m[name] = []byte(value)
	}
	return m, nil
}

// Payload formats: the byte stored before a completed record's payload.
const (
	formatRaw     = "="
	formatDeflate = "z"
)

var deflaters = pool[*flate.Writer]{fresh: func() *flate.Writer {
	w, _ := flate.NewWriter(nil, flate.BestSpeed)
	return w
}}

// looksRandom reports whether the first 256 bytes of p take more distinct
// values than text ever does: 256 random bytes take about 162 of the 256
// (ciphertext, deflated or JPEG data), JSON and other text fewer than 100.
// Deflating such a payload (about 75µs for 10 KiB) would not shrink it.
func looksRandom(p []byte) bool {
	var seen [256]bool
	distinct := 0
	for _, c := range p[:min(len(p), 256)] {
		if !seen[c] {
			seen[c] = true
			distinct++
		}
	}
	return distinct >= 128
}

// maxInflated bounds a decompressed payload, against a corrupted record.
var maxInflated = 64 << 20 // a variable for its test only

// decodePayload undoes encodePayload.
func decodePayload(v string) ([]byte, error) {
	if v == "" {
		return nil, errors.New("idem: unreadable record: no payload format")
	}
	switch v[:1] {
	case formatRaw:
		return []byte(v[1:]), nil
	case formatDeflate:
		r := flate.NewReader(strings.NewReader(v[1:]))
		defer r.Close()
		p, err := io.ReadAll(io.LimitReader(r, int64(maxInflated)+1))
		if err != nil || len(p) > maxInflated {
			return nil, fmt.Errorf("idem: unreadable record: bad compressed payload: %v", err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("idem: unreadable record: payload format %q", v[:1])
}
