package idemcaddy

// ClientUsers returns how many handlers use the shared client of a redis
// URL and CA file (0 when there is none).
func ClientUsers(url, caCert string) int {
	n, _ := clients.References(clientKey(url, caCert))
	return n
}

// NewClient is newClient, for tests of the URL forms.
var NewClient = newClient
