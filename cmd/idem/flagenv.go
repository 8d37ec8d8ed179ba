package main

import (
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// envPrefix begins the name of every flag's environment variable.
const envPrefix = "IDEM_"

// configuredByEnvironment holds the commands whose every flag may also come
// from the environment: the servers, which containers configure that way.
// The one-shot commands take flags only, so that a variable left in a
// shell (IDEM_YES) never answers for the operator.
var configuredByEnvironment = map[string]bool{}

// registerServer adds the command called name, as register does, and lets
// each of its flags come from its environment variable (envName).
func registerServer(name string, spec commandSpec) bool {
	configuredByEnvironment[name] = true
	return register(name, spec)
}

// envName returns the environment variable of the flag called name:
// IDEM_ and the name in upper case, '-' as '_' (-scope-header:
// IDEM_SCOPE_HEADER).
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envUsage is the paragraph of -h that tells how variables and flags meet.
const envUsage = `Every flag may also be set by its environment variable, named after each
flag below: IDEM_ and the flag's name in upper case, '-' as '_'
(-scope-header: IDEM_SCOPE_HEADER; IDEM_REQUIRE_KEY=true). A flag on the
command line wins over its variable; an empty variable counts as unset; a
variable whose value does not parse stops the command at start. -redis
falls back to REDIS_URL after IDEM_REDIS.
`

// annotateEnv adds the variable's name to the usage of every flag of fs.
func annotateEnv(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += " ($" + envName(f.Name) + ")"
	})
}

// setFromEnv sets every flag of fs that the command line did not set from
// its environment variable, when that is set and not empty; lookup reads
// the environment (os.LookupEnv). It returns an error naming the variable
// whose value the flag refuses.
func setFromEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok || v == "" {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q: not a value of -%s: %v", name, v, f.Name, serr)
		}
	})
	return err
}

// serviceLink matches the variables Kubernetes sets for every Service in
// the namespace (FOO_SERVICE_HOST, FOO_PORT_8080_TCP_ADDR, ...): a Service
// called idem gives IDEM_ ones that are not meant for the command.
var serviceLink = regexp.MustCompile(`_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?)$`)

// unknownEnv returns the names, sorted, of the variables of environ
// (os.Environ) that begin with IDEM_ but are no flag's of fs, leaving out
// Kubernetes service links: most likely misspelt flags.
func unknownEnv(fs *flag.FlagSet, environ []string) []string {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] && !serviceLink.MatchString(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
