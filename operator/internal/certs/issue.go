// Package certs gives the workers TLS without any outside tool: a CA of the operator's own,
// kept in a Secret in its namespace, signs one serving certificate that every worker presents
// (its names are the wildcards of the operator namespace's Services, so one certificate covers
// every node's worker Service and survives nodes coming and going). Clients trust the CA
// bundle: the operator in memory, Job pods through a ConfigMap in their namespace.
//
// Both certificates are renewed once a third of their life is left. A new CA is published in
// the bundle next to the old one, and the serving certificate moves to it only a day later, so
// every client has had the time to learn it first.
package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// Pair is a certificate and its private key.
type Pair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// backdate covers clocks a little behind the operator's.
const backdate = 5 * time.Minute

// NewCA makes a self-signed CA valid from now for validity.
func NewCA(now time.Time, validity time.Duration) (Pair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "revault worker CA " + now.UTC().Format("2006-01-02")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, nil)
}

// Issue makes a serving certificate for dnsNames signed by ca, valid from now for validity
// (never past the CA's own end).
func Issue(ca Pair, dnsNames []string, now time.Time, validity time.Duration) (Pair, error) {
	if len(dnsNames) == 0 {
		return Pair{}, errors.New("a serving certificate needs at least one DNS name")
	}
	end := now.Add(validity)
	if end.After(ca.Cert.NotAfter) {
		end = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsNames[0]},
		DNSNames:    dnsNames,
		NotBefore:   now.Add(-backdate),
		NotAfter:    end,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return sign(tmpl, &ca)
}

// sign makes a new P-256 key and a certificate for tmpl, signed by parent (self-signed when nil).
func sign(tmpl *x509.Certificate, parent *Pair) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Pair{}, err
	}
	tmpl.SerialNumber = serial
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		return Pair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Pair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// ParsePair reads a PEM certificate (the first of the chain) and its PEM private key, and checks
// that they belong together.
func ParsePair(certPEM, keyPEM []byte) (Pair, error) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return Pair{}, err
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return Pair{}, errors.New("no PEM private key")
	}
	k, err := parseKey(b.Bytes)
	if err != nil {
		return Pair{}, err
	}
	pub, ok := k.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(certs[0].PublicKey) {
		return Pair{}, errors.New("the private key is not the certificate's")
	}
	return Pair{Cert: certs[0], Key: k, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

func parseKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	return nil, errors.New("unsupported private key (want PKCS#8, SEC1 or PKCS#1)")
}

// ParseCerts reads every certificate of a PEM bundle; a bundle without one is an error.
func ParseCerts(bundle []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := bundle
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// Due reports whether c should be replaced: less than a third of its life is left.
func Due(c *x509.Certificate, now time.Time) bool {
	return !now.Before(RenewAt(c))
}

// RenewAt is when c becomes Due.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotAfter.Add(-life / 3)
}

// Bundle is the PEM of the CAs still valid at now, in the order given.
func Bundle(now time.Time, cas ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range cas {
		if c != nil && now.Before(c.NotAfter) {
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
	}
	return b.Bytes()
}

// Verify checks that c is valid for name at now and chains to one of roots.
func Verify(c *x509.Certificate, roots *x509.CertPool, name string, now time.Time) error {
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// SignedBy reports whether c was issued by ca (its signature checks with ca's key).
func SignedBy(c, ca *x509.Certificate) bool {
	return ca != nil && c.CheckSignatureFrom(ca) == nil
}

// ServingNames are the names on the workers' certificate: every Service of the operator's
// namespace, short and with the cluster domain.
func ServingNames(namespace, clusterDomain string) []string {
	names := []string{"*." + namespace + ".svc"}
	if clusterDomain != "" {
		names = append(names, "*."+namespace+".svc."+clusterDomain)
	}
	return names
}

// sameNames reports whether c carries exactly names.
func sameNames(c *x509.Certificate, names []string) bool {
	a, b := slices.Clone(c.DNSNames), slices.Clone(names)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
