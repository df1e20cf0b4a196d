import type { ModelSpec, PricingFile } from '../models/pricing.ts';
import type { balanceView, GrantRequest } from '../users/service.ts';

/** A user's money (`GET /v1/user/balance`'s answer). */
export type UserBalance = ReturnType<typeof balanceView>;
/** A user in a list. */
export interface UserBalanceLine {
  user: string;
  connected: boolean;
  balance: string;
  held: string;
  available: string;
  currency: string;
}

/**
 * The admin operations — projects, API keys, models and pricing, end users and their money, invites,
 * payments — as one interface with two implementations: ./local.ts works on the database with the
 * process's services (the command line next to the database), ./remote.ts calls a running server's
 * admin API `/admin/v1` (TOLLGATE_URL and TOLLGATE_ADMIN_TOKEN). The command line (../cli/) is one
 * command table over this interface. Each implementation answers the view its side has always shown
 * (the admin API's views over HTTP, the database rows' on the database); the fields below are those
 * both have.
 */

// biome-ignore lint/suspicious/noExplicitAny: JSON views, read field by field by the command line
export type Json = any;

/** A mistake in how an operation was called (a missing option, an operation the side cannot do). */
export class UsageError extends Error {}

/** The settings a project can be given at creation or later (`project create/set`). */
export interface ProjectSettingsInput {
  checkoutUrl?: string;
  returnUrl?: string;
  connectMessage?: string;
  topupMessage?: string;
  maxCompletionTokens?: number;
  debtLimit?: string;
}

export interface NewProject {
  name: string;
  currency: string;
  upstreamUrl?: string | undefined;
  upstreamKey?: string | undefined;
  settings: ProjectSettingsInput;
}

export interface ProjectChange {
  name?: string | undefined;
  upstreamUrl?: string | undefined;
  upstreamKey?: string | undefined;
  settings: ProjectSettingsInput;
}

export interface ProjectLine {
  id: string;
  name: string;
  currency: string;
  /** On the database. */
  upstreamUrl?: string | null;
  /** Over HTTP (the admin API's project view). */
  provider?: { baseUrl: string | null };
}

export interface KeyLine {
  id: string;
  name: string;
  prefix: string;
  revokedAt: unknown;
}

export interface NewUserKeyInput {
  user: string;
  name: string;
  expiresAt?: string | undefined;
  spendCap?: string | undefined;
}

export interface UserKeyLine {
  id: string;
  user: string;
  name: string;
  prefix: string;
  spendCap: string | null;
  expiresAt: string | null;
  revokedAt: string | null;
}

export interface Deposit {
  id: string;
  user: string;
  amount: string;
  currency: string;
  balance: string;
}

export interface Grant {
  amount: string;
  currency: string;
  user: string;
  reason: string;
  expiresAt: string | null;
  balance: string;
}

export interface ProviderSpec {
  name: string;
  baseUrl: string;
  key?: string;
  kind?: string;
  timeouts: { connectMs?: number; responseMs?: number };
}

export interface AdminOperations {
  createProject(
    input: NewProject,
  ): Promise<{ id: string; apiKey: string; apiKeyId: string; currency: string; name: string }>;
  listProjects(): Promise<ProjectLine[]>;
  showProject(projectId: string): Promise<Record<string, unknown>>;
  updateProject(
    projectId: string,
    change: ProjectChange,
  ): Promise<{ id: string; name: string; settings: unknown; upstreamUrl: string | null }>;

  createKey(projectId: string, name: string): Promise<{ id: string; apiKey: string; prefix: string }>;
  listKeys(projectId: string): Promise<KeyLine[]>;
  /** `projectId` is needed over HTTP (the admin API names keys within their project). */
  revokeKey(
    keyId: string,
    projectId: string | undefined,
  ): Promise<{ id: string; projectId: string; revoked: true; propagated: boolean }>;

  applyModels(
    projectId: string,
    file: PricingFile,
  ): Promise<{ created: string[]; updated: string[]; deleted: string[] }>;
  listModels(projectId: string): Promise<{ models: ModelSpec[] }>;

  connectUser(projectId: string, user: string): Promise<{ changed: boolean }>;
  /** A user's money as the balance API shows it: balance, held, available, paid, credits, connected. */
  showUser(projectId: string, user: string): Promise<UserBalance>;
  /** The project's users in id order (a page of `limit`), those whose id contains `search` when given. */
  listUsers(
    projectId: string,
    query: { search?: string | undefined; limit: number },
  ): Promise<{ data: UserBalanceLine[]; has_more: boolean }>;
  /** `amount` as given: checked in the project's currency. */
  deposit(projectId: string, user: string, amount: string): Promise<Deposit>;
  grant(projectId: string, input: GrantRequest): Promise<Grant>;

  /** An end-user key (`tgu_…`, in `key` once); `expiresAt` ISO 8601, `spendCap` in the project's currency. */
  createUserKey(projectId: string, input: NewUserKeyInput): Promise<UserKeyLine & { key: string }>;
  listUserKeys(projectId: string, user: string): Promise<UserKeyLine[]>;
  revokeUserKey(projectId: string, keyId: string): Promise<UserKeyLine & { propagated: boolean }>;

  createInvite(
    email: string,
    expiresInDays: number | undefined,
  ): Promise<{ email: string; url: string; expiresAt: string }>;

  connectPayments(projectId: string, body: Record<string, unknown>): Promise<Json>;
  showPayments(projectId: string): Promise<Json>;
  updatePaymentSettings(projectId: string, body: Record<string, unknown>): Promise<Json>;
  disconnectPayments(projectId: string): Promise<Json>;
  listPayments(projectId: string, user: string | undefined): Promise<Json>;
  refundPayment(projectId: string, paymentId: string, amount: string | undefined): Promise<Json>;
}

/** The operations only the database side does (the admin API has no route for them). */
export interface DatabaseOperations extends AdminOperations {
  addProvider(
    projectId: string,
    spec: ProviderSpec,
  ): Promise<{ name: string; baseUrl: string; kind: string }>;
  listProviders(
    projectId: string,
  ): Promise<Array<{ name: string; baseUrl: string; kind: string; keySet: boolean }>>;
  removeProvider(projectId: string, name: string): Promise<boolean>;
  setSpendCaps(
    projectId: string,
    user: string,
    caps: { daily: string | null; monthly: string | null },
  ): Promise<{ daily?: string | undefined; monthly?: string | undefined }>;
  /** Re-enables or disables a webhook subscription (the REST surface only disables). */
  setWebhookActive(subscriptionId: string, active: boolean): Promise<{ isActive: boolean; url: string }>;
}
