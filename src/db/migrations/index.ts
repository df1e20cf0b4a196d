import type { Migration } from 'kysely/migration';
import * as foundation from './0001_foundation.ts';
import * as chat from './0002_chat.ts';
import * as users from './0003_users.ts';
import * as webhooks from './0004_webhooks.ts';
import * as runtimeChecks from './0005_runtime_checks.ts';
import * as openaiCompat from './0006_openai_compat.ts';
import * as metering from './0007_metering.ts';
import * as webhooksProduction from './0008_webhooks_production.ts';
import * as routingLimits from './0009_routing_limits.ts';
import * as admin from './0010_admin.ts';
import * as exactCharges from './0011_exact_charges.ts';
import * as payments from './0014_payments.ts';
import * as messages from './0015_messages.ts';
import * as holdMargin from './0016_hold_margin.ts';
import * as managedBy from './0017_managed_by.ts';
import * as creditGrants from './0018_credit_grants.ts';
import * as recharges from './0019_recharges.ts';
import * as auditLog from './0020_audit_log.ts';
import * as escrow from './0021_escrow.ts';
import * as ledgerWalletKey from './0022_ledger_wallet_key.ts';
import * as uncreditedPayments from './0023_uncredited_payments.ts';
import * as visibleHeld from './0024_visible_held.ts';
import * as bounds from './0025_bounds.ts';
import * as providerBilled from './0026_provider_billed.ts';
import * as moneyTrust from './0027_money_trust.ts';
import * as endUserKeys from './0028_end_user_keys.ts';
import * as testPayments from './0029_test_payments.ts';
import * as managedProjects from './0030_managed_projects.ts';
import * as responsesRetention from './0031_responses_retention.ts';

/**
 * Every migration, in order. Names sort lexically; add new ones at the end with the next number.
 * Listed statically so the compiled build and the embedded database need no directory scanning.
 */
export const migrations: Record<string, Migration> = {
  '0001_foundation': foundation,
  '0002_chat': chat,
  '0003_users': users,
  '0004_webhooks': webhooks,
  '0005_runtime_checks': runtimeChecks,
  '0006_openai_compat': openaiCompat,
  '0007_metering': metering,
  '0008_webhooks_production': webhooksProduction,
  '0009_routing_limits': routingLimits,
  '0010_admin': admin,
  '0011_exact_charges': exactCharges,
  '0014_payments': payments,
  '0015_messages': messages,
  '0016_hold_margin': holdMargin,
  '0017_managed_by': managedBy,
  '0018_credit_grants': creditGrants,
  '0019_recharges': recharges,
  '0020_audit_log': auditLog,
  '0021_escrow': escrow,
  '0022_ledger_wallet_key': ledgerWalletKey,
  '0023_uncredited_payments': uncreditedPayments,
  '0024_visible_held': visibleHeld,
  '0025_bounds': bounds,
  '0026_provider_billed': providerBilled,
  '0027_money_trust': moneyTrust,
  '0028_end_user_keys': endUserKeys,
  '0029_test_payments': testPayments,
  '0030_managed_projects': managedProjects,
  '0031_responses_retention': responsesRetention,
};
