package idemcaddy

// ClientUsers returns how many handlers use the shared client of a redis
// URL (0 when there is none).
func ClientUsers(url string) int {
	n, _ := clients.References(url)
	return n
}

// NewClient is newClient, for tests of the URL forms.
var NewClient = newClient
