// URLs as wasi:http wants them: scheme, authority and path apart. The rules
// are those of the Rust SDK's `Url::parse` (sdk/src/http.rs), so the Rust and
// the JavaScript drivers accept the same endpoints.

/**
 * Splits `scheme://authority[/path][?query][#fragment]`: `{url: {https,
 * authority, pathAndQuery}}`, or `{why}` when `text` is not an absolute
 * `http` or `https` URL. User info is refused (credentials are the host's
 * business); the fragment is dropped.
 */
export function parseUrl(text) {
  const bad = (why) => ({ why: `${JSON.stringify(text)}: ${why}` });
  if (/[\s\u0000-\u001f\u007f-\u009f]/.test(text)) {
    return bad('contains whitespace or control characters');
  }
  const sep = text.indexOf('://');
  if (sep < 0) return bad('not an absolute url');
  const scheme = text.slice(0, sep).toLowerCase();
  if (scheme !== 'http' && scheme !== 'https') return bad('scheme must be http or https');
  const rest = text.slice(sep + 3);
  const end = rest.search(/[/?#]/);
  const authority = end < 0 ? rest : rest.slice(0, end);
  if (authority === '') return bad('no host');
  const why = checkAuthority(authority);
  if (why) return bad(why);
  const tail = (end < 0 ? '' : rest.slice(end)).split('#')[0];
  const pathAndQuery = tail === '' ? '/' : tail.startsWith('?') ? `/${tail}` : tail;
  return { url: { https: scheme === 'https', authority, pathAndQuery } };
}

/** Why `host`, `host:port`, `[v6]` or `[v6]:port` is malformed, if it is. */
function checkAuthority(authority) {
  if (authority.includes('@')) return 'user info is not supported; the host adds credentials';
  let host;
  let port;
  if (authority.startsWith('[')) {
    const close = authority.indexOf(']');
    if (close < 0) return 'unclosed [';
    host = authority.slice(1, close);
    const after = authority.slice(close + 1);
    if (after.startsWith(':')) port = after.slice(1);
    else if (after !== '') return 'junk after ]';
  } else {
    const colon = authority.indexOf(':');
    if (colon >= 0) {
      host = authority.slice(0, colon);
      port = authority.slice(colon + 1);
      if (port.includes(':')) return 'ipv6 addresses must be in brackets';
    } else {
      host = authority;
    }
  }
  if (host === '') return 'no host';
  if (port !== undefined && !(/^\+?[0-9]+$/.test(port) && Number(port) <= 65535)) {
    return 'bad port';
  }
  return undefined;
}

/**
 * Percent-encodes `text` for use as one path segment or query key or value:
 * every UTF-8 byte but `A-Z a-z 0-9 - . _ ~` is encoded (`encodeURIComponent`
 * leaves `!'()*` alone, which the Rust SDK encodes).
 */
export function encodeComponent(text) {
  let out = '';
  for (const b of new TextEncoder().encode(text)) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9\-._~]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}
