package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
)

// tokenCmd is "meshctl token": make keys, issue and inspect bearer tokens.
func (g *ctlFlags) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make a signing key, issue and inspect bearer tokens",
		Long: `Bearer tokens are HS256 JWTs signed with a key shared by the hubs
(meshd --auth-key FILE). A token names its holder (--sub), its roles
(checked against a method's required roles) and the method patterns it
may serve as an agent (--serve memory.* lets an agent register memory.get,
never echo.* or admin.*).

A key file holds at least 32 bytes, as base64 text or raw bytes, and must
not be readable by other users (chmod 600).`,
	}
	cmd.AddCommand(g.tokenKeygenCmd(), g.tokenIssueCmd(), g.tokenInspectCmd())
	return cmd
}

func (g *ctlFlags) tokenKeygenCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:     "keygen --out FILE",
		Short:   "Write a new random 32-byte signing key (mode 0600)",
		Example: `  meshctl token keygen --out /etc/agentmesh/auth.key`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageErr("--out FILE is required")
			}
			if _, err := auth.NewKeyFile(out); err != nil {
				return withCode(ExitError, err)
			}
			fmt.Fprintf(g.stderr, "wrote a 32-byte key to %s (mode 0600)\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to create; an existing file is never overwritten")
	return cmd
}

func (g *ctlFlags) tokenIssueCmd() *cobra.Command {
	var keyFile, sub, kid string
	var roles, serve []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "issue --key FILE --sub NAME [--role R ...] [--serve PATTERN ...] [--ttl DUR]",
		Short: "Issue a signed token and print it",
		Long: `Issue a signed token and print it on stdout.

--serve takes a method name, a prefix pattern "name.*" or "*"; method
names are ASCII letters, digits, "_" and "-" in dot-separated segments.

The token's "kid" header names its key, so that hubs holding several keys
(a rotation: meshd --auth-key old.key,new.key) check it with that one.

The role "hub" is refused: peer hubs mint their own tokens, one per dial,
bound to the hub and address they dial, and answer with a proof of their
own; a hub accepts no other hub token.`,
		Example: `  meshctl token issue --key auth.key --sub memory-agent --serve 'memory.*'
  meshctl token issue --key auth.key --sub console --role reader --ttl 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if keyFile == "" || sub == "" {
				return usageErr("--key FILE and --sub NAME are required")
			}
			if slices.Contains(roles, auth.RolePeer) {
				return usageErr("--role %s: peer tokens are minted by the hubs themselves, per dial; a hub accepts no other", auth.RolePeer)
			}
			key, err := auth.LoadKey(keyFile)
			if err != nil {
				return usageErr("%v", err)
			}
			if kid == "" {
				kid = auth.KeyID(key)
			}
			tok, err := auth.IssueKID(key, kid, auth.Claims{Subject: sub, Roles: roles, Serve: serve}, ttl)
			if err != nil {
				return usageErr("%v", err)
			}
			fmt.Fprintln(g.stdout, tok)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&keyFile, "key", "", "signing key file")
	f.StringVar(&sub, "sub", "", "subject: the agent, caller or hub the token is for")
	f.StringArrayVar(&roles, "role", nil, "a role of the holder (repeat for more)")
	f.StringArrayVar(&serve, "serve", nil, "a method pattern the holder may serve as an agent (repeat for more)")
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid")
	f.StringVar(&kid, "kid", "", "key id in the token's header: the hubs pick the key by it (default: the key's id, the first 8 hex digits of its SHA-256; a LABEL given to meshd as --auth-key LABEL=FILE)")
	return cmd
}

func (g *ctlFlags) tokenInspectCmd() *cobra.Command {
	var keyFiles []string
	cmd := &cobra.Command{
		Use:   "inspect [TOKEN|-] --key FILE",
		Short: "Verify a token and print its claims as JSON",
		Long: `Verify a token's signature and validity and print its claims as JSON.

TOKEN "-" reads it from stdin; no TOKEN reads $MESH_TOKEN (either keeps it
out of the shell history). An invalid token prints "UNAUTHENTICATED:
reason" on stderr and exits 1.`,
		Example: `  meshctl token inspect "$TOKEN" --key auth.key`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(keyFiles) == 0 {
				return usageErr("--key FILE is required")
			}
			tok := envOr("MESH_TOKEN", "")
			if len(args) == 1 {
				tok = args[0]
			}
			if tok == "-" {
				line, err := bufio.NewReader(io.LimitReader(g.stdin, auth.MaxTokenLen+2)).ReadString('\n')
				if err != nil && err != io.EOF {
					return usageErr("reading the token from stdin: %v", err)
				}
				tok = line
			}
			tok = strings.TrimSpace(tok)
			if tok == "" {
				return usageErr("no token: pass TOKEN, - for stdin, or set $MESH_TOKEN")
			}
			keys, _, err := loadAuthKeys(keyFiles)
			if err != nil {
				return usageErr("%v", err)
			}
			v, err := auth.NewKeySetVerifier(keys)
			if err != nil {
				return usageErr("%v", err)
			}
			c, err := v.Verify(tok)
			if err != nil {
				e := envelope.AsError(err)
				fmt.Fprintf(g.stderr, "%s: %s\n", e.Code, e.Message)
				return withCode(ExitError, errReported)
			}
			b, err := json.MarshalIndent(c, "", "  ")
			if err != nil {
				return withCode(ExitError, err)
			}
			fmt.Fprintf(g.stdout, "%s\n", b)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&keyFiles, "key", nil, "signing key file; repeat (or a comma list) for several, LABEL=FILE for a key known by the kid LABEL, as meshd --auth-key")
	return cmd
}
