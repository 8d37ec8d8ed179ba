package verify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A History and a Sink can be shared by several processes: one process
// holds them and serves Handler on a loopback address; the others make
// theirs with Remote, whose calls and effects are recorded by the server.
// Every time in the shared History is the server's: a call starts when the
// server records its start, which the caller waits for before it calls
// idem, and ends when the server records its end, which the caller sends
// after idem returned; a call's recorded interval therefore holds its real
// one, which keeps I3 (a call that starts after a result was handed out)
// sound. A process killed in the middle of a call leaves that call without
// an end: the History keeps it unfinished (End -1, no Kind), its function
// counts as run if it started, and its effects count as offered.

// remoteMsg is the body of a request to Handler and of its answer.
type remoteMsg struct {
	ID       int    `json:"id,omitempty"`
	Key      string `json:"key,omitempty"`
	Request  string `json:"request,omitempty"`
	Probe    bool   `json:"probe,omitempty"`
	Via      string `json:"via,omitempty"`
	Fence    int64  `json:"fence,omitempty"`
	Kind     Kind   `json:"kind,omitempty"`
	Value    string `json:"value,omitempty"`
	OK       bool   `json:"ok,omitempty"`
	Accepted bool   `json:"accepted,omitempty"`
}

// Handler returns the HTTP handler through which other processes record in
// h and offer effects to s (see Remote).
func Handler(h *History, s *Sink) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var m remoteMsg
		if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&m) != nil {
			http.Error(rw, "verify: bad request", http.StatusBadRequest)
			return
		}
		op := &Op{h: h, id: m.ID}
		if path := strings.TrimPrefix(r.URL.Path, "/"); path != "begin" && !h.has(m.ID) {
			http.Error(rw, "verify: unknown call", http.StatusBadRequest)
			return
		}
		var out remoteMsg
		switch strings.TrimPrefix(r.URL.Path, "/") {
		case "begin":
			out.ID = h.begin(m.Key, m.Request, m.Probe, m.Via).id
		case "ran":
			op.Ran(m.Fence)
		case "end":
			op.finish(h.Now(), m.Kind, m.Value)
		case "lookup":
			out.Value, out.OK = s.Lookup(m.Key, m.Fence)
		case "apply":
			out.Accepted = s.Apply(op, m.Key, m.Fence, m.Value)
		default:
			http.NotFound(rw, r)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(out)
	})
}

// Remote returns a History and a Sink that record in, and offer effects to,
// those a Handler serves at url (as "http://127.0.0.1:port"). Their Check,
// Len and Faults see nothing: the server's History holds the calls. Err
// reports the first request to the server that failed; an effect whose
// offer failed counts as refused.
func Remote(url string) (*History, *Sink) {
	rc := &remote{url: strings.TrimSuffix(url, "/"), client: &http.Client{
		Timeout:   time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256},
	}}
	h := &History{start: time.Now(), remote: rc}
	return h, &Sink{h: h, remote: rc}
}

// Err returns the first failed request of a History made by Remote, or nil.
func (h *History) Err() error {
	if h.remote == nil {
		return nil
	}
	h.remote.mu.Lock()
	defer h.remote.mu.Unlock()
	return h.remote.err
}

// remote is the client side of Handler.
type remote struct {
	url    string
	client *http.Client

	mu  sync.Mutex
	err error
}

// do sends m to path and returns the answer; a failure is kept in err.
func (rc *remote) do(path string, m remoteMsg) (remoteMsg, bool) {
	var out remoteMsg
	body, _ := json.Marshal(m)
	resp, err := rc.client.Post(rc.url+"/"+path, "application/json", bytes.NewReader(body))
	if err == nil {
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("verify: %s: %s", path, resp.Status)
		} else {
			err = json.NewDecoder(resp.Body).Decode(&out)
		}
		_ = resp.Body.Close()
	}
	if err != nil {
		rc.mu.Lock()
		if rc.err == nil {
			rc.err = errors.Join(errors.New("verify: remote history"), err)
		}
		rc.mu.Unlock()
		return out, false
	}
	return out, true
}
