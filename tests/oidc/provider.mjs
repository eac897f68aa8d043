// The [auth] issuer of tests/acceptance/test_oidc_provider.py: the certified oidc-provider, as a
// team would run it in front of a construct-mcp server, on 127.0.0.1.
//
//   node provider.mjs PORT RESOURCES REDIRECT_URI [PAGE_REDIRECT_URI]
//
// One public client ("construct-host", PKCE, no secret) whose redirect URI is REDIRECT_URI; each
// resource indicator of RESOURCES (comma-separated; the first, the server's /mcp URL, is the
// default) gets JWT access tokens (ES256) for the scopes construct:read, construct:operate and
// construct:approve, with the resource as their audience; any other resource is invalid_target.
// With PAGE_REDIRECT_URI, a second public client ("construct-runs") for the server's run pages.
// With OPAQUE=1 in the environment, the first resource's access tokens are opaque instead, and the
// confidential client "construct-server" (secret INTROSPECTION_SECRET) may introspect any token
// (RFC 7662); tokens can be revoked (RFC 7009) by the client they were issued to. A person signs in with the
// provider's development forms (any login; the password is not checked) and consents: the test
// fills both in as a browser would. Prints "listening" once it accepts connections.
import { generateKeyPairSync, randomUUID } from "node:crypto";
import Provider, { errors } from "oidc-provider";

const [port, resourceList, redirectUri, pageRedirectUri] = process.argv.slice(2);
if (!port || !resourceList || !redirectUri) {
  console.error("usage: node provider.mjs PORT RESOURCES REDIRECT_URI");
  process.exit(2);
}
const SCOPES = "construct:read construct:operate construct:approve";
const resources = resourceList.split(",");
const opaque = process.env.OPAQUE === "1";

// new keys at every start, each with a key id of its own: a restart is a key rotation
function signingKey(kid) {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  return { ...privateKey.export({ format: "jwk" }), kid: `${kid}-${randomUUID()}`, alg: "ES256", use: "sig" };
}
const rsa = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey;

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [
    {
      client_id: "construct-host",
      token_endpoint_auth_method: "none",
      redirect_uris: [redirectUri],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
    },
    ...(opaque
      ? [
          {
            client_id: "construct-server",
            client_secret: process.env.INTROSPECTION_SECRET,
            token_endpoint_auth_method: "client_secret_basic",
            redirect_uris: [],
            grant_types: [],
            response_types: [],
          },
        ]
      : []),
    ...(pageRedirectUri
      ? [
          {
            client_id: "construct-runs",
            token_endpoint_auth_method: "none",
            redirect_uris: [pageRedirectUri],
            grant_types: ["authorization_code"],
            response_types: ["code"],
          },
        ]
      : []),
  ],
  // id tokens are signed RS256 (the OIDC default); access tokens for the resource ES256
  jwks: { keys: [{ ...rsa.export({ format: "jwk" }), kid: "rsa-1", alg: "RS256", use: "sig" }, signingKey("ec-1")] },
  scopes: ["openid", "offline_access", ...SCOPES.split(" ")],
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    introspection: { enabled: opaque, allowedPolicy: () => true },
    revocation: { enabled: opaque },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resources[0],
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, indicator) => {
        if (!resources.includes(indicator)) {
          throw new errors.InvalidTarget();
        }
        return {
          scope: SCOPES,
          audience: indicator,
          accessTokenTTL: 600,
          accessTokenFormat: opaque && indicator === resources[0] ? "opaque" : "jwt",
          jwt: { sign: { alg: "ES256" } },
        };
      },
    },
  },
  findAccount: (_ctx, sub) => ({
    accountId: sub,
    claims: () => ({ sub, email: `${sub}@example.com` }),
  }),
});
provider.proxy = false;
provider.listen(Number(port), "127.0.0.1", () => console.log("listening"));
