package idem

import "testing"

// A call handed back by done keeps no reference to its arguments (a
// payload is the caller's memory); one whose command may still be sent is
// left as it is, never reused.
func TestScriptCallDone(t *testing.T) {
	s := NewRedisStore(nil)
	payload := []byte("the-payload")

	c := s.call(completeScript, "id", true, true)
	c.text("owner")
	c.bytes(payload)
	c.arg(ms(1))
	c.running = true
	c.done()
	if c.argv[4] == nil || c.texts[3].b == nil {
		t.Fatal("done cleared a call whose command may still be sent")
	}

	c = s.call(completeScript, "id", true, true)
	c.text("owner")
	c.bytes(payload)
	c.arg(ms(1))
	if c.running {
		t.Fatal("a call starts as running")
	}
	n, nt := c.n, c.nt
	c.done()
	for i := range n {
		if c.argv[i] != nil {
			t.Fatalf("argv[%d] kept after done: %v", i, c.argv[i])
		}
	}
	for i := range nt {
		if c.texts[i].b != nil {
			t.Fatalf("texts[%d] kept after done", i)
		}
	}
}
