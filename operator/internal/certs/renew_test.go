package certs

import (
	"testing"
	"time"

	"github.com/revault-io/revault/operator/internal/config"
)

var (
	t0    = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	life  = Lifetimes{CA: 300 * 24 * time.Hour, Serving: 90 * 24 * time.Hour}
	names = ServingNames("revault-system", "cluster.local")
	// A worker Service's name, as clients check it.
	worker = "revault-worker-ssd-node1.revault-system.svc"
)

func renew(t *testing.T, st State, now time.Time) (State, time.Time) {
	t.Helper()
	st, next, err := Renew(st, names, now, life)
	if err != nil {
		t.Fatal(err)
	}
	return st, next
}

// trusted checks that the serving certificate is valid for a worker Service at now under the
// bundle a client holds.
func trusted(t *testing.T, st State, bundle []byte, now time.Time) error {
	t.Helper()
	roots, err := Roots(bundle)
	if err != nil {
		t.Fatal(err)
	}
	return Verify(st.Serving.Cert, roots, worker, now)
}

func TestFirstIssueIsTrustedForEveryWorkerService(t *testing.T) {
	st, next := renew(t, State{}, t0)
	bundle := Bundle(t0, st.CA.Cert)
	for _, name := range []string{worker, "revault-worker-hdd-x.revault-system.svc", "revault-worker-ssd-node1.revault-system.svc.cluster.local"} {
		roots, _ := Roots(bundle)
		if err := Verify(st.Serving.Cert, roots, name, t0); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	roots, _ := Roots(bundle)
	for _, name := range []string{"revault-worker-ssd-node1.other.svc", "evil.example.com", "a.b.revault-system.svc"} {
		if Verify(st.Serving.Cert, roots, name, t0) == nil {
			t.Errorf("%s: trusted, want refused", name)
		}
	}
	if want := RenewAt(st.Serving.Cert); !next.Equal(want) {
		t.Errorf("next %v, want the serving certificate's renewal %v", next, want)
	}
	// Nothing to do before then: the same certificates come back.
	again, _ := renew(t, st, next.Add(-time.Minute))
	if again.Serving.Cert.SerialNumber.Cmp(st.Serving.Cert.SerialNumber) != 0 || again.CA.Cert.SerialNumber.Cmp(st.CA.Cert.SerialNumber) != 0 {
		t.Error("reissued before it was due")
	}
}

func TestServingRenewedAtTwoThirdsOfItsLife(t *testing.T) {
	st, next := renew(t, State{}, t0)
	renewed, _ := renew(t, st, next)
	if renewed.Serving.Cert.SerialNumber.Cmp(st.Serving.Cert.SerialNumber) == 0 {
		t.Fatal("not renewed when due")
	}
	if renewed.CA.Cert.SerialNumber.Cmp(st.CA.Cert.SerialNumber) != 0 {
		t.Error("the CA changed with the serving certificate")
	}
	// A client that held the bundle from the start trusts the new certificate.
	if err := trusted(t, renewed, Bundle(t0, st.CA.Cert), next); err != nil {
		t.Error(err)
	}
}

func TestNamesChangedReissues(t *testing.T) {
	st, _ := renew(t, State{}, t0)
	moved, _, err := Renew(st, ServingNames("backups", "cluster.local"), t0.Add(time.Hour), life)
	if err != nil {
		t.Fatal(err)
	}
	roots, _ := Roots(Bundle(t0, moved.CA.Cert))
	if err := Verify(moved.Serving.Cert, roots, "revault-worker-ssd-n.backups.svc", t0.Add(time.Hour)); err != nil {
		t.Error(err)
	}
}

// A CA rotation keeps every client working: the new CA is published next to the old one, the
// serving certificate stays on the old CA for PublishDelay, and clients that learnt only the
// old bundle keep trusting the workers until then.
func TestCARotationPublishesBeforeItSigns(t *testing.T) {
	st, next := renew(t, State{}, t0)
	old := Bundle(t0, st.CA.Cert)
	due := RenewAt(st.CA.Cert)
	// The serving certificate is renewed on time until the CA is due.
	for next.Before(due) {
		st, next = renew(t, st, next)
	}
	rot, next := renew(t, st, due)
	if rot.Previous == nil || rot.CA.Cert.SerialNumber.Cmp(st.CA.Cert.SerialNumber) == 0 {
		t.Fatal("the CA was not rotated when due")
	}
	if !SignedBy(rot.Serving.Cert, rot.Previous.Cert) {
		t.Fatal("the serving certificate moved to the new CA at once")
	}
	if err := trusted(t, rot, old, due); err != nil {
		t.Errorf("a client with the old bundle: %v", err)
	}
	if want := due.Add(PublishDelay); !next.Equal(want) {
		t.Errorf("next %v, want the end of the publishing delay %v", next, want)
	}
	// A serving certificate due within the delay is still signed by the previous CA.
	early, _ := renew(t, State{CA: rot.CA, Previous: rot.Previous, RotatedAt: rot.RotatedAt}, due.Add(time.Hour))
	if !SignedBy(early.Serving.Cert, rot.Previous.Cert) {
		t.Error("a certificate issued within the delay is signed by the new CA")
	}
	newBundle := Bundle(due, rot.CA.Cert, rot.Previous.Cert)
	moved, _ := renew(t, rot, next)
	if !SignedBy(moved.Serving.Cert, moved.CA.Cert) {
		t.Fatal("the serving certificate did not move to the new CA after the delay")
	}
	if err := trusted(t, moved, newBundle, next); err != nil {
		t.Errorf("a client with the published bundle: %v", err)
	}
	// The old CA leaves the bundle once it expired.
	late, _ := renew(t, moved, rot.Previous.Cert.NotAfter.Add(time.Minute))
	if late.Previous != nil {
		t.Error("an expired previous CA is still kept")
	}
}

// A CA Secret that is lost (deleted by hand) or expired gives a new CA and a certificate it
// signed, never a certificate signed by a CA nobody trusts.
func TestLostCAIssuesAgain(t *testing.T) {
	st, _ := renew(t, State{}, t0)
	st.CA = nil
	again, _ := renew(t, st, t0.Add(time.Hour))
	if !SignedBy(again.Serving.Cert, again.CA.Cert) {
		t.Fatal("the serving certificate is not signed by the new CA")
	}
}

func TestParsePairRefusesAForeignKey(t *testing.T) {
	a, _ := NewCA(t0, time.Hour)
	b, _ := NewCA(t0, time.Hour)
	if _, err := ParsePair(a.CertPEM, b.KeyPEM); err == nil {
		t.Fatal("a certificate with another's key was accepted")
	}
	if _, err := ParsePair(a.CertPEM, a.KeyPEM); err != nil {
		t.Fatal(err)
	}
}

// The shortest CA life the configuration accepts rotates without overlap, also when every
// rotation is made late (the operator down for 8 hours when the CA was due): the serving
// certificate is always signed by a CA that was in the bundle a PublishDelay earlier.
func TestShortestCALifeNeverSignsWithAnUnpublishedCA(t *testing.T) {
	short := Lifetimes{CA: config.MinCAValidity, Serving: 10 * time.Minute}
	const down = 8 * time.Hour
	st, _, err := Renew(State{}, names, t0, short)
	if err != nil {
		t.Fatal(err)
	}
	// published[serial of a CA] = when it first appeared in the bundle.
	published := map[string]time.Time{st.CA.Cert.SerialNumber.String(): t0.Add(-PublishDelay)}
	for now := t0; now.Before(t0.Add(20 * short.CA)); now = now.Add(10 * time.Minute) {
		if due := RenewAt(st.CA.Cert); !now.Before(due) && now.Before(due.Add(down)) {
			continue // the operator is down: nothing renews, nothing changes
		}
		if st, _, err = Renew(st, names, now, short); err != nil {
			t.Fatal(err)
		}
		for _, ca := range []*Pair{st.CA, st.Previous} {
			if ca != nil {
				if _, ok := published[ca.Cert.SerialNumber.String()]; !ok {
					published[ca.Cert.SerialNumber.String()] = now
				}
			}
		}
		signer := st.CA
		if !SignedBy(st.Serving.Cert, signer.Cert) {
			signer = st.Previous
		}
		if signer == nil || !SignedBy(st.Serving.Cert, signer.Cert) {
			t.Fatalf("%s: the serving certificate is signed by neither CA in the bundle", now)
		}
		if p := published[signer.Cert.SerialNumber.String()]; now.Sub(p) < PublishDelay {
			t.Fatalf("%s: the serving certificate is signed by a CA published %s ago", now, now.Sub(p))
		}
		if err := trusted(t, st, Bundle(now, st.CA.Cert, st.Previous.cert()), now); err != nil {
			t.Fatalf("%s: %v", now, err)
		}
	}
}
