import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { buildConnector } from 'undici';

/**
 * Where Tollgate may open an outbound connection on a user's say-so: webhook destinations and model
 * provider base URLs. Private, loopback, link-local, carrier-grade NAT, multicast, reserved and
 * cloud-metadata addresses are refused unless allowed by configuration (WEBHOOK_ALLOW_PRIVATE_NETWORKS
 * for webhooks, TOLLGATE_ALLOW_PRIVATE_PROVIDERS for providers). The check runs when the URL is saved
 * (`checkDestination`) and again inside each connection (`guardedLookup`, `guardedConnector`), so the
 * address checked is the address connected to (a name that later resolves somewhere private — DNS
 * rebinding — is still refused).
 *
 * The ranges are ipaddr.js's classification: an IPv4 address must be plain `unicast`; an IPv6 address
 * must be `unicast` inside 2000::/3 (global unicast), or one of the forms that embed an IPv4 address —
 * IPv4-mapped, IPv4-translated, IPv4-compatible, NAT64 (64:ff9b::/96), 6to4, Teredo — whose embedded
 * addresses are all allowed in turn (a relay or translator would carry the connection to them).
 */

/** Every IPv4 address an IPv6 address carries, or undefined when it is not one of the embedding forms. */
function embeddedIpv4(address: ipaddr.IPv6): ipaddr.IPv4[] | undefined {
  const b = address.toByteArray();
  const v4 = (at: number, flip = 0) =>
    new ipaddr.IPv4([b[at]! ^ flip, b[at + 1]! ^ flip, b[at + 2]! ^ flip, b[at + 3]! ^ flip]);
  switch (address.range()) {
    case 'ipv4Mapped': // ::ffff:a.b.c.d
    case 'rfc6145': // ::ffff:0:a.b.c.d
      return [v4(12)];
    case 'rfc6052': // 64:ff9b::a.b.c.d; the local-use 64:ff9b:1::/48 places it by prefix: refused whole
      return address.match(NAT64_WELL_KNOWN) ? [v4(12)] : undefined;
    case '6to4': // 2002:AABB:CCDD::/48
      return [v4(2)];
    case 'teredo': // 2001:0:server:flags:port:~client
      return [v4(4), v4(12, 0xff)];
    default:
      // IPv4-compatible ::a.b.c.d (deprecated, RFC 4291): the first 96 bits are zero (:: and ::1 land
      // on 0.0.0.0/8, refused as well).
      if (address.match(IPV4_COMPATIBLE)) return [v4(12)];
      return undefined;
  }
}
const NAT64_WELL_KNOWN: [ipaddr.IPv6, number] = [ipaddr.IPv6.parse('64:ff9b::'), 96];
const IPV4_COMPATIBLE: [ipaddr.IPv6, number] = [ipaddr.IPv6.parse('::'), 96];
const GLOBAL_UNICAST: [ipaddr.IPv6, number] = [ipaddr.IPv6.parse('2000::'), 3];

function ipv4Allowed(address: ipaddr.IPv4): boolean {
  return address.range() === 'unicast';
}

/** True for an address an outbound request must not reach on a public deployment (and anything unparsable). */
export function isPrivateAddress(address: string): boolean {
  if (!ipaddr.isValid(address) || !isIP(address)) return true;
  const parsed = ipaddr.parse(address);
  if (parsed.kind() === 'ipv4') return !ipv4Allowed(parsed as ipaddr.IPv4);
  const v6 = parsed as ipaddr.IPv6;
  const embedded = embeddedIpv4(v6);
  if (embedded) return !embedded.every(ipv4Allowed);
  return !(v6.range() === 'unicast' && v6.match(GLOBAL_UNICAST));
}

/**
 * What a developer is told of any refused destination (private, local, unresolvable alike): telling
 * them apart would let anyone map the names the server resolves inside its network. The detail is in
 * the error's `message`, for the server log only.
 */
export const REFUSED_DESTINATION =
  'its host is not a public address Tollgate may reach (private, local and unresolvable names are refused alike)';

export class DestinationError extends Error {
  readonly code: 'private_address' | 'unresolvable' | 'invalid_url';
  /** The one message for developers (REFUSED_DESTINATION); `message` has the detail, for the log. */
  readonly publicMessage = REFUSED_DESTINATION;
  constructor(code: DestinationError['code'], message: string) {
    super(message);
    this.code = code;
  }
}

/** The host of a URL without IPv6 brackets. */
export function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, '');
}

/** Names that are local by convention, refused without asking DNS. */
function isLocalName(host: string): boolean {
  const name = host.toLowerCase().replace(/\.$/, '');
  return name === 'localhost' || name.endsWith('.localhost') || name.endsWith('.internal');
}

function resolveAll(host: string): Promise<LookupAddress[]> {
  return new Promise((resolve, reject) => {
    dnsLookup(host, { all: true, verbatim: true }, (err, addresses) => {
      if (err) reject(err);
      else resolve(addresses);
    });
  });
}

/**
 * Checks a destination URL's host: an address literal directly, a name through DNS (every address it
 * resolves to must be public). Throws DestinationError.
 */
export async function checkDestination(url: URL, allowPrivate: boolean): Promise<void> {
  if (allowPrivate) return;
  const host = hostOf(url);
  if (isIP(host)) {
    if (isPrivateAddress(host))
      throw new DestinationError('private_address', `${host} is a private, loopback or reserved address`);
    return;
  }
  if (isLocalName(host)) throw new DestinationError('private_address', `${host} is a local name`);
  let addresses: LookupAddress[];
  try {
    addresses = await resolveAll(host);
  } catch (err) {
    throw new DestinationError(
      'unresolvable',
      `${host} could not be resolved (${(err as NodeJS.ErrnoException).code ?? 'DNS error'})`,
    );
  }
  const bad = addresses.find((a) => isPrivateAddress(a.address));
  if (bad)
    throw new DestinationError(
      'private_address',
      `${host} resolves to ${bad.address}, a private, loopback or reserved address`,
    );
}

type LookupCallback = (
  err: NodeJS.ErrnoException | null,
  address: string | LookupAddress[],
  family?: number,
) => void;

/**
 * A `lookup` for net/tls connections that refuses names resolving to blocked addresses, so the check
 * and the connection use the same answer.
 */
export function guardedLookup(
  hostname: string,
  options: { all?: boolean; family?: number | string } | undefined,
  callback: LookupCallback,
): void {
  dnsLookup(hostname, { ...(options ?? {}), all: true, verbatim: true } as never, (err, result) => {
    if (err) return callback(err, '');
    const addresses = result as unknown as LookupAddress[];
    const bad = addresses.find((a) => isPrivateAddress(a.address));
    if (bad || addresses.length === 0) {
      // (what the name resolves to is not said: this message reaches delivery logs developers read)
      return callback(refused(`${hostname} is not a public address`), '');
    }
    if (options?.all) return callback(null, addresses);
    const first = addresses[0]!;
    callback(null, first.address, first.family);
  });
}

function refused(message: string): NodeJS.ErrnoException {
  const error = new Error(`refused: ${message}`) as NodeJS.ErrnoException;
  error.code = 'EPRIVATEADDRESS';
  return error;
}

/**
 * An undici `connect` that refuses private destinations: an address literal is judged before
 * connecting (Node connects to literals without a lookup), a name through `guardedLookup`. Every new
 * connection of the pool passes here, so a name that resolves elsewhere later is judged again.
 */
export function guardedConnector(options: buildConnector.BuildOptions): buildConnector.connector {
  const connect = buildConnector({ ...options, lookup: guardedLookup } as buildConnector.BuildOptions);
  return (opts, callback) => {
    const host = opts.hostname.replace(/^\[|\]$/g, '');
    if (isIP(host) && isPrivateAddress(host)) {
      callback(refused(`${host} is a private, loopback or reserved address`), null);
      return;
    }
    connect(opts, callback);
  };
}
