package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out), out.String())
	s := out.String()
	t.Log("\n" + s)

	require.Equal(t, 2, strings.Count(s, "server: charging"), "one charge per payment")
	for _, want := range []string{
		"server: charging 10.00 EUR at the provider",
		"client: receipt rc_0001 for 10.00 EUR, a first answer",
		"client: receipt rc_0001 for 10.00 EUR, idempotent-replayed: true",
		"client: InvalidArgument IDEMPOTENCY_KEY_REUSED",
		"network: the answer is lost on the way",
		"client: receipt rc_0002 for 25.00 EUR, idempotent-replayed: true",
		"The provider charged 2 times for 2 payments.",
	} {
		require.Contains(t, s, want)
	}

	// Five calls sent: three with the first payment's key, then the second
	// payment's, sent again by the interceptor.
	keys := regexp.MustCompile(`client: sending \S+, idempotency-key: (\S+)`).FindAllStringSubmatch(s, -1)
	require.Len(t, keys, 5)
	var got []string
	for _, m := range keys {
		got = append(got, m[1])
	}
	first, second := got[0], got[3]
	require.Len(t, first, 36, "a key made by idemclient.NewKey")
	require.NotEqual(t, first, second)
	require.Equal(t, []string{first, first, first, second, second}, got)
}
