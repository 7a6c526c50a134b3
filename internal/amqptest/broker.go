package amqptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CloseNamedConnections makes the broker itself close every connection
// whose client-provided name is name, as an operator or a failing node
// would (what rabbitmqctl close_connection does, reply 320
// CONNECTION_FORCED). It returns how many it closed. One rabbitmqctl call
// finds and closes them all: a call starts an Erlang node, which takes a
// second on an idle machine and several on a busy one, and the chaos tests
// close a dozen connections at a time. A connection still in its
// handshake has no client properties yet (none): it is passed over.
func CloseNamedConnections(tb testing.TB, name string) int {
	tb.Helper()
	lit := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(name)
	expr := `Pids = [Pid || Pid <- rabbit_networking:connections(),
	{<<"connection_name">>, _, N} <- case catch rabbit_reader:info(Pid, [client_properties]) of
		[{client_properties, Props}] when is_list(Props) -> Props; _ -> [] end,
	N =:= <<"` + lit + `">>],
[catch rabbit_networking:close_connection(Pid, "closed by test") || Pid <- Pids],
length(Pids).`
	out, err := rabbitmqctl(tb, "eval", expr).CombinedOutput()
	if err != nil {
		tb.Fatalf("amqptest: rabbitmqctl eval (closing the connections named %q): %v: %s", name, err, out)
	}
	closed, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		tb.Fatalf("amqptest: rabbitmqctl eval (closing the connections named %q) printed %q", name, out)
	}
	return closed
}

// SetMaxMessageSize changes the broker's max_message_size for channels
// opened from now on, and restores the previous value when the test ends.
func SetMaxMessageSize(tb testing.TB, size int) {
	tb.Helper()
	eval := func(expr string) string {
		out, err := rabbitmqctl(tb, "eval", expr).CombinedOutput()
		if err != nil {
			tb.Fatalf("amqptest: rabbitmqctl eval %s: %v: %s", expr, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	prev := eval("{ok, V} = application:get_env(rabbit, max_message_size), V.")
	eval(fmt.Sprintf("application:set_env(rabbit, max_message_size, %d).", size))
	tb.Cleanup(func() { eval("application:set_env(rabbit, max_message_size, " + prev + ").") })
}

// TLSProxy terminates TLS with a fresh self-signed certificate for
// "localhost" and forwards the plain connection to the test broker, so that
// amqps:// can be tested against a broker without a TLS listener. It returns
// the proxy's amqps URL and the certificate pool that trusts it.
func TLSProxy(tb testing.TB) (string, *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		tb.Fatal(err)
	}
	p := serve(tb, ln)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return (&url.URL{Scheme: "amqps", User: p.user, Host: "localhost:" + port, Path: "/"}).String(), pool
}

// Ctl runs rabbitmqctl with args and returns its output, failing the test
// if it fails.
func Ctl(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := rabbitmqctl(tb, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("amqptest: rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// rabbitmqctl returns the command that runs rabbitmqctl with args: the
// prefix in OUTBOX_RABBITMQCTL if set, rabbitmqctl itself if it is on the
// PATH, else rabbitmqctl inside the docker compose service of the repository.
func rabbitmqctl(tb testing.TB, args ...string) *exec.Cmd {
	tb.Helper()
	if prefix := strings.Fields(os.Getenv("OUTBOX_RABBITMQCTL")); len(prefix) > 0 {
		return exec.Command(prefix[0], append(prefix[1:], args...)...)
	}
	if path, err := exec.LookPath("rabbitmqctl"); err == nil {
		return exec.Command(path, args...)
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "docker-compose.yml")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("amqptest: rabbitmqctl is not on the PATH and no docker-compose.yml was found; set OUTBOX_RABBITMQCTL to the command that runs it")
		}
		dir = parent
	}
	return exec.Command("docker", append([]string{"compose", "-f", filepath.Join(dir, "docker-compose.yml"), "exec", "-T", "rabbitmq", "rabbitmqctl"}, args...)...)
}
