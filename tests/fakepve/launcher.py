# SPDX-License-Identifier: AGPL-3.0-or-later
#
# Test-only launcher for fakepve (AGPL), used by our integration tests and the demo. It is run as a
# separate process and never ships with the provider; nothing in the Rust crate links to it.
#
# It does what the fakepve CLI cannot: register API tokens, add nodes without guests, configure
# storages, give VMs created through the API a guest agent (so IP discovery can be tested), and take
# control commands while running (node offline, migrations, injected failures, request counts), and
# answer the node network list and the PCI/USB resource mappings from the scenario (`bridges`,
# `mappings`; ops `set_bridges`, `set_mappings`), size nodes (`maxcpu`, `maxmem` per node), keep
# HA rules as pve-ha-manager does (ops `ha_rules`, `ha_resources` show them), make answers and
# tasks take time (`latency`, `node_latency`, `task_secs`; ops `slow_network`, `task_secs`), and, for
# chaos runs: the network knobs (op `network`), changes applied after their client gave up
# (`late_apply`, `late_held`), and when every VM existed (`vm_lifetimes`). Every request is first
# checked against the official API schema of the release it emulates (`pve_version`, see
# release_schema.py and tests/pve-api/).
#
# Usage: python launcher.py SCENARIO.json
#   prints "fakepve listening on https://HOST:PORT" once ready, then reads one JSON command per line on
#   stdin and answers one JSON line on stdout: {"ok": true, "result": ...} or {"ok": false, "error": "..."}.
#   EOF on stdin stops the server.

import asyncio
import json
import logging
import re
import sys
import time

from aiohttp import web
from fakepve.model import PveError, TaskError
from fakepve.lxc import format_size
from fakepve.qemu import DRIVE_KEY, NEW_DISK, drives_of, is_cdrom, join_drive, split_drive, volume_ref, with_mac
from fakepve import shapes
from fakepve.routing import die, split_list
from fakepve.server import GENERIC, USER, FakePve, error, int_param, ok, params

import release_schema


class LauncherPve(FakePve):
    """FakePve whose VMs with `agent: 1` in their config answer guest-agent calls once running."""

    agent_default = False
    # Every write (anything but GET) as (wall-clock seconds, method, path, API token ID or user): which
    # of several provider replicas sent what, and when (op `writes`).
    writes = None
    # Node name -> bridge names, answered by GET /nodes/{node}/network (nodes not listed get fakepve's
    # generic answer: vmbr0 only). Kind -> mappings, answered by GET /cluster/mapping/{pci,usb}.
    bridges = None
    mappings = None

    def _record(self, request, body):
        """fakepve's request log, plus who sent each write: its API token, or its ticket's user."""
        if request.method != 'GET':
            auth = request.headers.get('Authorization', '')
            if auth.startswith('PVEAPIToken='):
                who = auth[len('PVEAPIToken='):].partition('=')[0]
            else:
                session = self.tickets.get(request.cookies.get('PVEAuthCookie'))
                who = session['user'] if session else ''
            if self.writes is None:
                self.writes = []
            self.writes.append((time.time(), request.method, request.path, who))
        super()._record(request, body)

    def _pve_before(self, *version):
        """Whether the emulated PVE (`pve_version`) is older than `version`, e.g. (8, 1)."""
        have = tuple(int(x) for x in re.findall(r'\d+', self.version)[:len(version)])
        return have < version

    def _routes_pools(self):
        """`DELETE /pools?poolid=` came with nested pools in PVE 8.1 (pve-manager Pool.pm, delete_pool);
        before, only `DELETE /pools/{poolid}` existed and the other answered 501."""
        routes = super()._routes_pools()

        async def delete(*args, **kwargs):
            if self._pve_before(8, 1):
                raise PveError(501, "Method 'DELETE /pools' not implemented")
            return await self._pool_delete(*args, **kwargs)
        return [(m, p, delete if (m, p) == ('DELETE', '/pools') else h) for m, p, h in routes]

    async def _generic(self, request):
        match = request[GENERIC]
        if request.method == 'GET' and match is not None:
            answer = None
            if match.template == '/nodes/{node}/network' and match.params.get('node') in (self.bridges or {}):
                names = self.bridges[match.params['node']]

                async def answer(_match, _values):
                    return [{'iface': name, 'type': 'bridge', 'active': 1, 'autostart': 1, 'exists': 1,
                             'families': ['inet'], 'method': 'manual', 'method6': 'manual', 'priority': 3}
                            for name in names]
            elif match.template in ('/cluster/mapping/pci', '/cluster/mapping/usb') and self.mappings is not None:
                kind = match.template.rsplit('/', 1)[-1]

                async def answer(_match, _values):
                    return [{'id': m['id'], 'description': m.get('description', ''), 'map': m.get('map', [])}
                            for m in self.mappings.get(kind, [])]
            if answer is not None:
                return ok(await self.answer(request, match, await params(request), request[USER], call=answer))
        rules = await self._ha_rules(request, match)
        if rules is not None:
            return rules
        ha = await self._ha_resources(request, match)
        if ha is not None:
            return ha
        resized = await self._qm_resize(request, match)
        if resized is not None:
            return resized
        return await super()._generic(request)

    # --- VM lifecycle conformance: HA resources that are really HA-managed VMs. fakepve answers
    # /cluster/ha/resources generically and stores nothing, so a VM registered there never became
    # HA-managed. pve-ha-manager src/PVE/API2/HA/Resources.pm: `create` refuses a sid already
    # defined, `delete` refuses a sid that is not HA-managed ("cannot delete service '<sid>', not HA
    # managed!") and otherwise removes it from the config, leaving the VM as it is.
    async def _ha_resources(self, request, match):
        if match is None or match.template not in ('/cluster/ha/resources', '/cluster/ha/resources/{sid}'):
            return None
        if request.method not in ('POST', 'DELETE'):
            return None
        values = dict(await params(request))
        values.update(match.params)
        sid = str(values.get('sid', ''))
        vmid = sid.split(':', 1)[1] if sid.startswith('vm:') else sid
        vm = self.guest(int(vmid)) if vmid.isdigit() else None
        if vm is None:
            return None
        if request.method == 'POST' and vm.ha_managed:
            raise PveError(500, "resource ID '{0}' already defined".format(sid))
        if request.method == 'DELETE' and not vm.ha_managed:
            raise PveError(500, "cannot delete service '{0}', not HA managed!".format(sid))
        response = await super()._generic(request)
        if response.status == 200:
            vm.ha_state = values.get('state', 'started') if request.method == 'POST' else None
            if (request.method == 'DELETE' and self.ha_purges
                    and str(values.get('purge', '1')) not in ('0', 'false')):
                self._ha_purge(sid)
        return response

    def _qm_destroy_purges_ha(self, v, vm):
        """qemu-server src/PVE/API2/Qemu.pm `destroy_vm`: with `purge`, an HA-managed VM also leaves the HA
        resources and (through pve-ha-manager `delete_service_from_config`) every HA rule, at the end of
        the destroy task. The purge is applied once the VM is gone (see `_ha_rules_settle`)."""
        if v.get('purge') and vm is not None and vm.ha_managed and self.ha_purges:
            self.ha_purge_pending = set(self.ha_purge_pending or ()) | {vm.vmid}

    # pve-ha-manager before 5.0.7 (early PVE 9.0): deleting an HA resource leaves its sid in every
    # rule (src/PVE/HA/Config.pm `delete_service_from_config` had no purge). Scenario `ha_purge`.
    ha_purges = True

    # --- HA rules (PVE 9, pve-ha-manager src/PVE/API2/HA/Rules.pm; fakepve has only the schema). All
    # rules live in one file with one digest; create and update check the whole rule set
    # (`check_feasibility`): a resource-affinity rule needs two resources, a negative one at most as many
    # as the cluster has nodes; resources must be HA-managed, nodes must exist. Errors die inside
    # `lock_ha_domain`, which prefixes them ("create ha rule failed: ...") and answers 500.
    ha_rules = None
    ha_rules_serial = 0
    ha_purge_pending = None

    def _ha_rules_digest(self):
        import hashlib
        return hashlib.sha1('{0}:{1}'.format(self.ha_rules_serial, sorted(
            (k, sorted(v.items(), key=str)) for k, v in (self.ha_rules or {}).items())).encode()).hexdigest()

    def _ha_rules_write(self):
        self.ha_rules_serial += 1

    def _ha_purge(self, sid):
        """pve-ha-manager src/PVE/HA/Config.pm `delete_service_from_config` with purge: the sid leaves
        every rule; a rule left with no resource is deleted."""
        rules = self.ha_rules or {}
        for name in list(rules):
            rules[name]['resources'].discard(sid)
            if not rules[name]['resources']:
                del rules[name]
        self._ha_rules_write()

    def _ha_rules_settle(self):
        for vmid in list(self.ha_purge_pending or ()):
            if self.guest(vmid) is None:
                self.ha_purge_pending.discard(vmid)
                self._ha_purge('vm:{0}'.format(vmid))

    def _ha_rule_view(self, name, rule):
        view = {'rule': name, 'type': rule['type'], 'resources': ','.join(sorted(rule['resources'])),
                'digest': self._ha_rules_digest(), 'order': rule['order']}
        for key in ('nodes', 'affinity', 'comment', 'strict', 'disable'):
            if rule.get(key) not in (None, ''):
                view[key] = rule[key]
        errors = self._ha_rule_errors(rule)
        if errors:
            view['errors'] = {'resources': ', '.join(errors)}
        return view

    def _ha_rule_errors(self, rule):
        errors = []
        if rule['type'] == 'resource-affinity':
            if len(rule['resources']) < 2:
                errors.append('rule is ineffective as there are less than two resources')
            if rule.get('affinity') == 'negative' and len(rule['resources']) > len(self.nodes):
                errors.append('rule defines more resources than available nodes')
        return errors

    def _ha_rule_check(self, name, rule, failed):
        unmanaged = sorted(sid for sid in rule['resources']
                           if not (sid.startswith('vm:') and sid[3:].isdigit() and self.guest(int(sid[3:])) is not None
                                   and self.guest(int(sid[3:])).ha_managed))
        if not rule['resources']:
            raise PveError(500, '{0}: no resources were specified'.format(failed))
        if unmanaged:
            raise PveError(500, '{0}: cannot use unmanaged resource(s) {1}.'.format(failed, ', '.join(unmanaged)))
        nodes = [n.split(':')[0] for n in split_list(rule.get('nodes') or '')]
        missing = sorted(n for n in nodes if n not in self.nodes)
        if rule['type'] == 'node-affinity' and not nodes:
            raise PveError(500, '{0}: no nodes were specified'.format(failed))
        if missing:
            raise PveError(500, '{0}: cannot use non-existent node(s) {1}.'.format(failed, ', '.join(missing)))
        errors = self._ha_rule_errors(rule) + self._ha_rule_conflicts(name, rule)
        if errors:
            raise PveError(500, "{0}: 400 Rule '{1}' is invalid.\nresources: {2}".format(failed, name, ', '.join(errors)))

    def _ha_rule_conflicts(self, name, rule):
        """The inter-rule checks of pve-ha-manager (src/PVE/HA/Rules/NodeAffinity.pm
        `check_single_resource_reference`; src/PVE/HA/Rules.pm
        `check_single_node_affinity_per_positive_resource_affinity_rule`,
        `check_negative_resource_affinity_node_affinity_consistency`) as errors of rule `name`, with
        `rule` written; the API refuses a rule with errors (Rules.pm `assert_feasibility`)."""
        rules = dict(self.ha_rules or {})
        rules[name] = rule
        live = dict((n, r) for n, r in rules.items() if not r.get('disable'))
        naff = dict((n, r) for n, r in live.items() if r['type'] == 'node-affinity')
        raff = dict((n, r) for n, r in live.items() if r['type'] == 'resource-affinity')
        errors = []
        if name in naff:
            for sid in sorted(rule['resources']):
                if any(sid in r['resources'] for n, r in naff.items() if n != name):
                    errors.append("resource '{0}' is already used in another node affinity rule".format(sid))
        for rid, r in sorted(raff.items()):
            touching = sorted(n for n, a in naff.items() if a['resources'] & r['resources'])
            if name not in [rid] + touching:
                continue
            if r.get('affinity') == 'positive' and len(touching) > 1:
                errors.append('resources are in multiple node affinity rules' if name == rid else
                              'at least one resource is in a positive resource affinity rule and there are other '
                              'resources in at least one other node affinity rule already')
            located = set(sid for n in touching for sid in naff[n]['resources'] & r['resources'])
            allowed = set(node.split(':')[0] for n in touching for node in split_list(naff[n].get('nodes') or ''))
            if r.get('affinity') == 'negative' and len(allowed) < len(located):
                errors.append('two or more resources are restricted to less nodes than available to the resources'
                              if name == rid else
                              'at least one resource is in a negative resource affinity rule and this rule would '
                              'restrict these to less nodes than available to the resources')
        return errors

    async def _ha_rules(self, request, match):
        if match is None or match.template not in ('/cluster/ha/rules', '/cluster/ha/rules/{rule}'):
            return None
        self._ha_rules_settle()
        self.ha_rules = self.ha_rules if self.ha_rules is not None else {}
        name = match.params.get('rule')

        async def answer(_match, values):
            rules = self.ha_rules
            if request.method == 'GET' and name is None:
                return [self._ha_rule_view(n, rules[n]) for n in sorted(rules, key=lambda n: rules[n]['order'])
                        if not values.get('type') or rules[n]['type'] == values['type']]
            if request.method == 'GET':
                if name not in rules:
                    raise PveError(500, "no such ha rule '{0}'".format(name))
                return self._ha_rule_view(name, rules[name])
            if request.method == 'DELETE':
                if rules.pop(name, None) is not None:
                    self._ha_rules_write()
                return None
            if request.method == 'POST':
                return self._ha_rule_create(values)
            return self._ha_rule_update(name, values)
        return ok(await self.answer(request, match, await params(request), request[USER], call=answer))

    # pve-ha-manager src/PVE/API2/HA/Rules.pm `create_rule`/`update_rule`: while HA groups exist
    # (`PVE::HA::Config::have_groups_been_migrated`), rule writes are refused; the CRM migrates the
    # groups only once every node runs PVE 9, is online and its LRM active (src/PVE/HA/Manager.pm
    # `try_persistent_group_migration`). Op `ha_groups` {names} sets the groups left.
    ha_groups = None

    def _ha_groups_block(self, verb):
        if self.ha_groups:
            raise PveError(500, 'cannot {0} ha rule: ha groups have not been migrated yet'.format(verb))

    def _ha_rule_create(self, values):
        failed = 'create ha rule failed'
        self._ha_groups_block('create')
        name, kind = str(values.get('rule', '')), str(values.get('type', ''))
        if kind not in ('node-affinity', 'resource-affinity'):
            raise PveError(400, 'Parameter verification failed.', {'type': 'value is not one of the allowed values'})
        if name in self.ha_rules:
            raise PveError(500, "{0}: HA rule '{1}' already defined".format(failed, name))
        rule = {'type': kind, 'resources': set(split_list(str(values.get('resources', '')))),
                'order': max([r['order'] for r in self.ha_rules.values()] + [0]) + 1}
        for key in ('nodes', 'affinity', 'comment'):
            if values.get(key) is not None:
                rule[key] = str(values[key])
        for key in ('strict', 'disable'):
            if str(values.get(key, '0')) in ('1', 'true'):
                rule[key] = 1
        if kind == 'resource-affinity' and rule.get('affinity') not in ('positive', 'negative'):
            raise PveError(400, 'Parameter verification failed.', {'affinity': 'property is missing and it is not optional'})
        self._ha_rule_check(name, rule, failed)
        self.ha_rules[name] = rule
        self._ha_rules_write()
        return None

    def _ha_rule_update(self, name, values):
        failed = 'update HA rules failed'
        self._ha_groups_block('update')
        if not values.get('type'):
            raise PveError(400, 'Parameter verification failed.', {'type': 'property is missing and it is not optional'})
        if values.get('digest') and values['digest'] != self._ha_rules_digest():
            raise PveError(500, '{0}: detected modified configuration - file changed by other user? Try again.'
                           .format(failed))
        if name not in self.ha_rules:
            raise PveError(500, "{0}: HA rule '{1}' does not exist".format(failed, name))
        rule = dict(self.ha_rules[name])
        if values.get('resources') is not None:
            rule['resources'] = set(split_list(str(values['resources'])))
        for key in ('nodes', 'affinity', 'comment'):
            if values.get(key) is not None:
                rule[key] = str(values[key])
        self._ha_rule_check(name, rule, failed)
        self.ha_rules[name] = rule
        self._ha_rules_write()
        return None

    # --- VM lifecycle conformance: qemu resize. fakepve answers it generically (any disk, nothing
    # changes); qemu-server src/PVE/API2/Qemu.pm `resize_vm` refuses a disk the config does not have
    # ("disk '<disk>' does not exist") or a CD-ROM, and records the new size in the drive.
    async def _qm_resize(self, request, match):
        if match is None or match.template != '/nodes/{node}/qemu/{vmid}/resize' or request.method != 'PUT':
            return None
        values = dict(await params(request))
        vm = self.find(match.params['node'], int(match.params['vmid']))
        disk = str(values.get('disk', ''))
        drive = vm.config.get(disk)
        if not drive:
            raise PveError(500, "disk '{0}' does not exist".format(disk))
        if 'media=cdrom' in str(drive):
            raise PveError(500, "you can't resize a cdrom")
        size = str(values.get('size', ''))
        response = await super()._generic(request)
        if response.status == 200 and not size.startswith('+'):
            parts = [p for p in str(drive).split(',') if not p.startswith('size=')]
            vm.config[disk] = ','.join(parts + ['size=' + size])
        return response

    # --- VM lifecycle conformance: clone to another node. qemu-server src/PVE/API2/Qemu.pm
    # `clone_vm` (through `$check_storage_access_clone`) requires every drive of the source, CD-ROM
    # ISOs included, to be on shared storage ("can't clone VM to node '<target>' (VM uses local
    # storage)"), whatever the target storage. fakepve checks only the target storage. Called by
    # `_qm_clone` below, before the VMID checks, where `$load_and_check` makes it.
    def _check_clone_source_shared(self, v):
        vm = self.guest(int(v['vmid']))
        target = v.get('target')
        if v.get('storage') and v['storage'] in self.storages:
            # `clone_vm`'s `storage_check_enabled` on the node it runs on (the template's), then on
            # `target`: "storage '<id>' is not available on node '<node>'".
            self._check_enabled(v['storage'], v['node'])
            if target:
                self._check_enabled(v['storage'], target)
        if vm is not None and vm.node == v['node'] and target and target not in (vm.node, 'localhost'):
            for _key, volume, _props in drives_of(vm.config):
                sid, _name = volume_ref(volume)
                if sid is None:
                    continue
                store = self.storages.get(sid, {})
                if not store.get('shared'):
                    raise PveError(500, "can't clone VM to node '{0}' (VM uses local storage)".format(target))

    # --- Linked clones on storage without the feature. qemu-server `clone_vm` asks pve-storage
    # `volume_has_feature(..., 'clone', ...)` for every disk of a linked clone (`full` = 0, the
    # default for a template) and dies with "Linked clone feature is not supported for '<volid>'
    # (<opt>)"; CD-ROMs are only referenced, cloud-init drives and tpmstate0 are always copied.
    # pve-storage answers no for plain LVM (LVMPlugin.pm: `clone` commented out) and iSCSI
    # (ISCSIPlugin.pm, ISCSIDirectPlugin.pm: `copy` only). fakepve refuses only non-base volumes.
    def _check_linked_clone_storage(self, v):
        vm = self.guest(int(v['vmid']))
        if vm is None or vm.node != v['node']:
            return
        full = v.get('full')
        if full is None:
            full = not vm.template
        if str(full) in ('1', 'true', 'True'):
            return
        for key, volume, props in drives_of(vm.config):
            sid, _name = volume_ref(volume)
            if sid is None or is_cdrom(volume, props) or key.startswith('tpmstate') or 'cloudinit' in volume:
                continue
            kind = self.storages.get(sid, {}).get('type', 'dir')
            if kind in ('lvm', 'iscsi', 'iscsidirect'):
                raise PveError(500, "Linked clone feature is not supported for '{0}' ({1})".format(volume, key))

    # qemu-server src/PVE/API2/Qemu.pm, `vm_shutdown`/`vm_stop`: for an HA-managed VM the API only runs
    # `ha-manager crm-command stop` in a `hastop` worker, which ends at once; the CRM stops the VM
    # later, on its own schedule. fakepve stops the VM inside that task when time_scale is 0; here
    # it stays running (the CRM has not acted yet) unless `ha_stop_applies` is set.
    ha_stop_applies = False

    async def _ha_request(self, vm, user, state):
        if state != 'stopped' or self.ha_stop_applies:
            return await super()._ha_request(vm, user, state)

        async def body():
            return None
        return await self.task(vm.node, 'hastop', vm.vmid, user, body, lock=False,
                               log=['Requesting HA stop for VM {0}'.format(vm.vmid)])

    # --- Time, for the benchmark. fakepve runs every task's body with the durations its model knows
    # (a VM start, stop or shutdown takes the VM's `*_secs`, 0 for a VM made through the API; an ISO
    # download 5 s), scaled by `time_scale`. `task_secs` ({task type: PVE seconds}, e.g. `qmcreate`,
    # `qmstart`, `imgcopy`, `qmshutdown`, `qmdestroy`) adds a duration of its own to every task of
    # that type, spent inside the task as on a real node (allocating a disk, booting QEMU), so the
    # caller sees it only by polling the task.
    task_secs = None

    async def task(self, node, ttype, tid, user, body, vm=None, lock=True, log=()):
        extra = (self.task_secs or {}).get(ttype, 0)
        if not extra:
            return await super().task(node, ttype, tid, user, body, vm=vm, lock=lock, log=log)

        async def slower():
            await self.pause(extra)
            return await body()
        return await super().task(node, ttype, tid, user, slower, vm=vm, lock=lock, log=log)

    async def _agent_call(self, match, values):
        vm = self.find(values['node'], values['vmid'])
        if self.agent_default and vm is not None and vm.agent is None and agent_enabled(vm.config):
            vm.agent = {'interfaces': self._booted_interfaces(vm)}
        return await super()._agent_call(match, values)

    # ---- NoCloud seeds: what a guest booted from one reports ----
    # A VM booted with one of our NoCloud seeds reports, through its guest agent, the static addresses
    # the seed's network-config gives its NICs (op `seed_network_config` shows that file).

    # Volume ID -> the bytes of the file uploaded there (fakepve keeps only the last upload's).
    uploads = None

    async def _upload(self, request):
        # pveproxy reads a request body only with a Content-Length (pve-http-server
        # src/PVE/APIServer/AnyEvent.pm: 501 "chunked transfer encoding not supported").
        if request.headers.get('Transfer-Encoding', '').lower() == 'chunked':
            raise PveError(501, 'chunked transfer encoding not supported')
        answer = await super()._upload(request)
        fields = self.uploaded or {}
        if 'filename' in fields:
            self.uploads = dict(self.uploads or {})
            self.uploads['{0}:iso/{1}'.format(request.match_info['storage'], fields['filename'])] = \
                fields.get('data', b'')
        return answer

    def seed_network_config(self, vm):
        """The `network-config` of the NoCloud seed attached to `vm`, if one of its CD-ROMs holds a
        seed uploaded here."""
        for value in vm.config.values():
            volid = str(value).split(',')[0]
            data = (self.uploads or {}).get(volid)
            if data is not None:
                return network_config_of(data)
        return None

    def _booted_interfaces(self, vm):
        """What the guest agent reports once Talos booted: the static addresses the seed's
        network-config gives the NICs it names by MAC (as Talos applies them; siderolabs/talos
        internal/app/machined/pkg/runtime/v1alpha1/platform/nocloud/metadata.go,
        applyNetworkConfigV1), else a DHCP-like lease on eth0."""
        statics = static_addresses(self.seed_network_config(vm) or '')
        if not statics:
            return default_interfaces(vm.vmid)
        out = [default_interfaces(vm.vmid)[0]]
        for key in sorted(k for k in vm.config if re.match(r'^net\d+$', k)):
            model = str(vm.config[key]).split(',')[0]
            mac = model.split('=', 1)[1].lower() if '=' in model else ''
            addresses = [{'ip-address': 'fe80::1:{0}'.format(key[3:]), 'ip-address-type': 'ipv6', 'prefix': 64}]
            for address in statics.get(mac, []):
                ip, prefix = address.split('/')
                addresses.append({'ip-address': ip, 'ip-address-type': 'ipv6' if ':' in ip else 'ipv4',
                                  'prefix': int(prefix)})
            out.append({'name': 'eth' + key[3:], 'hardware-address': mac, 'ip-addresses': addresses})
        return out

    # ---- Proxmox client conformance (old PVE 8 errors, next-id range, download-url as PVE does it) ----

    # PVE seconds a download-url task takes (scenario key `download_secs`).
    download_secs = 5

    # True: answer errors as PVE 8 did before pve-http-server's fix #6503 (January 2025): the body is
    # `{"data":null}` (plus `errors`) and the message is only in the HTTP reason phrase.
    old_pve8_errors = False
    # (lower, upper) of datacenter.cfg `next-id`, answered by GET /cluster/nextid.
    next_id_range = None

    def _build_app(self):
        app = super()._build_app()
        # Outermost, so it rewrites every error fakepve produces (its own middleware turns PveError
        # into a response).
        app.middlewares.insert(0, self._old_pve8_error_body)
        return app

    @web.middleware
    async def _old_pve8_error_body(self, request, handler):
        response = await handler(request)
        if not self.old_pve8_errors or not isinstance(response, web.Response) or response.status < 400:
            return response
        if response.content_type != 'application/json':
            return response
        body = json.loads(response.text)
        body.pop('message', None)
        old = web.json_response(body, status=response.status, reason=response.reason)
        if response.keep_alive is False:
            old.force_close()
        return old

    async def _nextid(self, v, user):
        """pve-manager Cluster.pm nextid with datacenter.cfg's next-id range."""
        if self.next_id_range is None or v.get('vmid') not in (None, ''):
            return await super()._nextid(v, user)
        lower, upper = self.next_id_range
        taken = set(vm.vmid for vm in self.vms) | set(ct.vmid for ct in self.cts)
        for vmid in range(lower, upper):
            if vmid not in taken:
                return str(vmid)
        raise PveError(500, 'unable to get any free VMID in range [{0}, {1}]'.format(lower, upper))

    def check_permissions(self, user, perms, values, declared=None):
        """pve-access-control RPCEnvironment.pm `check_api2_permissions`: `user => 'all'` lets every
        authenticated user in before any `check` (the method checks inside, as `get_options` does for
        Sys.Audit); fakepve evaluated the `check` first."""
        if user is not None and perms is not None and perms.get('user') == 'all':
            return
        return super().check_permissions(user, perms, values, declared)

    def _routes_datacenter_options(self):
        return [('GET', '/cluster/options', self._cluster_options)]

    async def _cluster_options(self, v, user):
        """pve-manager PVE/API2/Cluster.pm `get_options`: datacenter.cfg as parsed (`next-id` is an
        object of its bounds) with Sys.Audit on `/`, else only `console` and `tag-style`; both with
        `allowed-tags`."""
        config = {'keyboard': 'en-us'}
        if self.next_id_range is not None:
            lower, upper = self.next_id_range
            config['next-id'] = {'lower': str(lower), 'upper': str(upper)}
        if not self.allowed(user, '/', 'Sys.Audit'):
            config = {}
        config['allowed-tags'] = []
        return config

    async def _permissions(self, v, user):
        """pve-access-control `AccessControl.pm` `permissions` / `RPCEnvironment.pm`
        `get_effective_permissions`: the effective (inherited) privileges on the top-level paths, every
        path with an ACL and every pool member, paths without any privilege left out; with `path`, that
        path alone. fakepve listed the ACL entries as granted, not what they amount to per path."""
        who = v.get('userid') or user
        paths = {'/', '/access', '/access/groups', '/nodes', '/pool', '/sdn', '/storage', '/vms'}
        for name in dict.fromkeys((who, who.split('!')[0])):
            paths.update(path for path, _privs in (self.acl or {}).get(name, []))
        for name, ids in self.pools.items():
            paths.update('/vms/{0}'.format(vmid) for vmid in ids)
        if v.get('path') is not None:
            paths = {v['path']}
        answer = {}
        for path in sorted(paths):
            held = [priv for priv in sorted(shapes.PRIVILEGES) if self.allowed(who, path, priv)]
            if held:
                answer[path] = dict.fromkeys(held, 1)
        return answer

    async def _download_url(self, request):
        """download-url as pve-storage's Status.pm has it: Datastore.AllocateTemplate on the storage AND
        (Sys.Audit and Sys.Modify on / OR Sys.AccessNetwork on the node); the file name normalised (every
        character but [A-Za-z0-9_.-] becomes `_`); an existing file refused by the task unless a checksum
        proves it is the same (pve-common Tools.pm download_file_from_url)."""
        name, store = self._file_storage(request, 'download')
        user = request[USER]
        node = request.match_info['node']
        self.require(user, '/storage/' + name, 'Datastore.AllocateTemplate')
        if not (self.allowed(user, '/', 'Sys.Audit') and self.allowed(user, '/', 'Sys.Modify')) \
                and not self.allowed(user, '/nodes/' + node, 'Sys.AccessNetwork'):
            # pve-access-control RPCEnvironment.pm, exec_api2_perm_check: a failed 'or' names nothing.
            raise PveError(403, 'Permission check failed')
        p = await params(request)
        size = int_param(p, 'size', 1024 ** 2, minimum=0)
        p = self._verify(request, p, drop=('size',))
        self._need_file_storage(store, "can't upload to storage type '{0}', not a file based storage!")
        content = p['content']
        if content not in split_list(store.get('content')):
            raise die("storage '{0}' is not configured for content-type '{1}'".format(name, content))
        filename = re.sub(r'[^a-zA-Z0-9_.-]', '_', re.sub(r'^.*[/\\]', '', p['filename'].rstrip('\n')))
        if content == 'import':
            # Status.pm: `import` content takes only `SAFE_CHAR_CLASS_RE+` names ending in
            # UPLOAD_IMPORT_EXT_RE_1 (ova|qcow2|raw|vmdk), and those only from libpve-storage-perl
            # 8.3.6 (Proxmox VE 8.4); before, only `.ova`.
            exts = 'ova' if self._pve_before(8, 4) else 'ova|qcow2|raw|vmdk'
            if not re.match(r'^[a-zA-Z0-9\-\.\+\=\_]+\.(' + exts + ')$', filename):
                raise PveError(400, 'Parameter verification failed.',
                               {'filename': "invalid filename or wrong extension"})
            if p.get('compression'):
                raise die('decompression not supported for {0}'.format(content))
        exists = '{0}/{1}'.format(content, filename) in store.get('volumes', {})

        async def body():
            await self.pause(self.download_secs)
            if exists:
                if p.get('checksum'):
                    return
                raise TaskError("refusing to override existing file '{0}/template/{1}/{2}'".format(
                    self._storage_path(name), content, filename))
            self.store_file(name, filename, size, content)
        return ok(await self.task(node, 'download', name, user, body,
                                  log=['downloading {0} to {1}'.format(p.get('url'), filename)]))

    def _iso_on_storage(self, volid):
        """Whether an ISO volume is in its storage (uploaded or downloaded). fakepve's own volume list also
        counts what guest configs reference, so a deleted ISO a VM still names would look present."""
        sid, name = volume_ref(volid)
        store = self.storages.get(sid) if sid else None
        if store is None or not name.startswith('iso/'):
            return True
        return name in store.get('volumes', {}) or name[4:] in store.get('files', ())

    async def _do_start(self, vm, user, p):
        """qemu-server QemuServer.pm `vm_start_nolock` activates every volume of the config, CD-ROM ISOs
        included (`get_current_vm_volumes`), and pve-storage Plugin.pm `activate_volume` dies with
        "volume '<volid>' does not exist" for a file that is gone: the start task fails. fakepve starts
        the VM whatever its drives name. `vm_start` refuses a template, a locked VM and a running one
        ("VM <vmid> already running") before it calls `vm_start_nolock`, so those answers come first."""
        missing = [volume for _key, volume, props in drives_of(vm.config)
                   if is_cdrom(volume, props) and volume_ref(volume)[0] and not self._iso_on_storage(volume)]
        checked_before = vm.template or vm.status == 'running' or (vm.lock and vm.lock != 'suspended')
        if not missing or checked_before or vm.ha_managed:
            return await super()._do_start(vm, user, p)

        async def body():
            raise TaskError("volume '{0}' does not exist".format(missing[0]))
        return await self.task(vm.node, 'qmstart', vm.vmid, user, body, vm=vm)

    async def _qm_create(self, v, user):
        """qemu-server's create_vm checks SDN.Use on every bridge (QemuServer::check_bridge_access, the
        local bridges under /sdn/zones/localnetwork/); fakepve 0.5.0 does so only for containers."""
        for key in sorted(v):
            if re.fullmatch(r'net\d+', key) and v[key]:
                self._check_bridge(user, v[key])
            if DRIVE_KEY.match(key):
                self._check_import_from(key, str(v[key]))
        self._check_tags(user, v.get('tags'))
        return await super()._qm_create(v, user)

    # --- `import-from` (boot mode `image`), which fakepve 0.5.0 does not model. qemu-server
    # src/PVE/API2/Qemu.pm: `$check_drive_param` refuses `import-from` on anything but
    # `<storage>:0`; `$check_storage_access` takes `images` or `import` volumes as the source;
    # `create_disks` makes the disk the source's *virtual* size (`$import_from_volid`) and the config
    # keeps only the new volume and its size. A Talos nocloud qcow2 is ~100 MB in storage for an
    # 8 GiB disk (Talos DefaultRAWDiskSize).
    import_virtual_bytes = 8 * 1024 ** 3

    def _check_import_from(self, key, value):
        volume, props = split_drive(value)
        source = props.get('import-from')
        if source is None:
            return
        found = NEW_DISK.match(volume)
        if not found or float(found.group(2)) != 0:
            raise PveError(400, 'Parameter verification failed.', {
                key: "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"})
        sid, name = volume_ref(source)
        vol = self._volumes(sid).get(name) if sid in self.storages else None
        if vol is None:
            raise die('volume {0} does not exist'.format(source))
        if vol.get('content') not in ('images', 'import'):
            raise die("{0}: '{1}' has wrong type '{2}' - needs to be 'images' or 'import'".format(
                key, source, vol.get('content')))

    def _qm_new_drive(self, vmid, key, value, default):
        volume, props = split_drive(value)
        source = props.get('import-from')
        if source is None:
            return super()._qm_new_drive(vmid, key, value, default)
        props = dict(props)
        del props['import-from']
        sid = NEW_DISK.match(volume).group(1) or default
        src_sid, src_name = volume_ref(source)
        vol = self._volumes(src_sid)[src_name]
        size = self.import_virtual_bytes if vol.get('content') == 'import' else int(vol.get('size') or 0)
        volid, _fmt = self._qm_alloc(sid, vmid, props.pop('format', None), size)
        props['size'] = format_size(size)
        return join_drive(volid, props), [volid]

    # datacenter.cfg `user-tag-access` ({'user-allow': free|existing|list|none, 'user-allow-list': [...]})
    # and `registered-tags`.
    user_tag_access = None
    registered_tags = ()

    def _check_tags(self, user, tags):
        """pve-guest-common GuestHelpers.pm assert_tag_permissions: without Sys.Modify on / a tag must be
        allowed by user-tag-access and not registered."""
        if not tags or self.allowed(user, '/', 'Sys.Modify'):
            return
        access = self.user_tag_access or {}
        allow = access.get('user-allow', 'free')
        listed = set(access.get('user-allow-list', [])) if allow != 'none' else set()
        if allow == 'existing':
            for vm in self.vms:
                listed.update(t for t in re.split(r'[;, ]+', str(vm.config.get('tags', ''))) if t)
        for tag in (t for t in re.split(r'[;, ]+', tags) if t):
            if (tag not in listed and allow != 'free') or tag in self.registered_tags:
                raise PveError(403, "Permission check failed (/, Sys.Modify for modifying tag '{0}')".format(tag))

    # Volume IDs the content listing leaves out, as a listing read just before another client stored
    # the file would (op `unlist_volume`).
    unlisted_volumes = ()

    async def _content_list(self, v, user):
        listed = await super()._content_list(v, user)
        return [e for e in listed if e.get('volid') not in self.unlisted_volumes]

    def _storage_path(self, name):
        store = self.storages.get(name, {})
        return store.get('path') or ('/var/lib/vz' if name == 'local' else '/mnt/pve/' + name)

    # --- VM lifecycle conformance: the listing's pvestatd lag (ops `listing_without_stats`,
    # `stats_lag`). pve-manager PVE/API2/Cluster.pm `resources` builds each VM entry with
    # PVE/API2Tools.pm `extract_vm_stats`, which takes name, status, template and the usage numbers
    # from the RRD data pvestatd broadcasts (PVE/Service/pvestatd.pm); lock and tags come from the
    # config. Without RRD data (a VM created seconds ago, every VM of a node offline for minutes) an
    # entry has only id/vmid/node/type, status "unknown", and pool/tags/lock. fakepve always fills
    # everything in.
    stats_missing_vmids = None
    stats_missing_nodes = None
    stats_lag_secs = 0.0
    # VMID -> the status pvestatd last reported (~10 s stale on real PVE), shown instead of the real one.
    stats_stale_status = None
    _stats_first_seen = None

    def _without_stats(self, item):
        if item.get('type') != 'qemu':
            return False
        if item.get('vmid') in (self.stats_missing_vmids or ()) or item.get('node') in (self.stats_missing_nodes or ()):
            return True
        if not self.stats_lag_secs:
            return False
        seen = self._stats_first_seen.setdefault(item.get('vmid'), time.monotonic())
        return time.monotonic() - seen < self.stats_lag_secs * (self.time_scale or 1)

    # --- `/cluster/status` of a standalone node (scenario key `standalone`). pve-manager
    # PVE/API2/Cluster.pm `get_status` lists a `type: cluster` entry only when pmxcfs knows a corosync
    # cluster; a node never joined to one answers with just its own entry. fakepve always has a cluster.
    standalone = False

    async def _cluster_status(self, request):
        response = await super()._cluster_status(request)
        if not self.standalone or response.status != 200:
            return response
        data = [e for e in json.loads(response.text).get('data') or [] if e.get('type') != 'cluster']
        return ok(data[:1])

    async def _resources(self, request):
        response = await super()._resources(request)
        if self._stats_first_seen is None:
            self._stats_first_seen = {}
        if response.status != 200:
            return response
        data = json.loads(response.text).get('data') or []
        for item in data:
            self._sized(item)
            if item.get('type') == 'qemu' and item.get('vmid') in (self.stats_stale_status or {}):
                item['status'] = self.stats_stale_status[item['vmid']]
            if self._without_stats(item):
                kept = {k: v for k, v in item.items() if k in ('id', 'vmid', 'node', 'type', 'pool', 'tags', 'lock', 'hastate')}
                item.clear()
                item.update(kept, status='unknown')
        return ok(data)

    # --- Node sizes and vCPU counts (scenario `nodes: [{"name", "maxcpu", "maxmem"}]`). fakepve gives
    # every node 4 CPUs and 8 GiB and every VM sockets × cores. pve-manager PVE/API2Tools.pm
    # `extract_node_stats` and `extract_vm_stats` take `maxcpu` from what pvestatd broadcasts: the
    # node's CPU count, and for a VM qemu-server src/PVE/QemuServer.pm `vmstatus` `cpus`: sockets ×
    # cores, capped at the host's CPU count, replaced by `vcpus` when that is set.
    node_sizes = None

    # Storages the scenario sizes (`avail`, `total`) are listed in /cluster/resources with that size:
    # pve-manager PVE/API2Tools.pm `extract_storage_stats` sets `maxdisk` and `disk` from the storage's
    # status (total, used) that pvestatd broadcasts, the numbers /nodes/{node}/storage answers.
    # fakepve lists every storage there as 100 GiB with nothing used.
    sized_storages = ()

    def _sized(self, item):
        if item.get('type') == 'storage' and item.get('storage') in self.sized_storages \
                and item.get('status') == 'available':
            total, used, _avail = self._space(self.storages[item['storage']])
            item['maxdisk'], item['disk'] = total, used
            return
        size = (self.node_sizes or {}).get(item.get('node'), {})
        if item.get('type') == 'node' and item.get('status') == 'online':
            item.update((k, size[k]) for k in ('maxcpu', 'maxmem') if k in size)
        elif item.get('type') == 'qemu' and 'maxcpu' in item:
            vm = self.guest(item.get('vmid'))
            host_cpus = size.get('maxcpu', 4)
            if vm is not None:
                cfg = vm.config
                cpus = min(int(cfg.get('sockets', 1)) * int(cfg.get('cores', 1)), host_cpus)
                if cfg.get('vcpus'):
                    cpus = int(cfg['vcpus'])
                item['maxcpu'] = cpus

    async def _nodes(self, request):
        response = await super()._nodes(request)
        if response.status != 200 or not self.node_sizes:
            return response
        data = json.loads(response.text).get('data') or []
        for item in data:
            self._sized(item)
        return ok(data)

    # --- VM lifecycle conformance: `destroy-unreferenced-disks` with an image storage offline.
    # qemu-server src/PVE/QemuServer.pm `destroy_vm`: the disks the config references are freed
    # first (failures only warned about), then with purge_unreferenced `PVE::Storage::vdisk_list`
    # walks every image storage, and one that is not online dies, failing the task before the config
    # is removed: the VM stays, and every retry with the flag fails the same way. fakepve skips
    # offline storages silently.
    async def _qm_destroy(self, v, user):
        vm = self.find(v['node'], v['vmid'])
        self._qm_destroy_purges_ha(v, vm)
        if vm is not None and vm.lock == 'suspended':
            # qemu-server src/PVE/QemuServer.pm `destroy_vm`: the `suspended` lock of a VM
            # hibernated to disk is the one lock a destroy does not refuse (`has_lock($conf,
            # 'suspended')` skips `check_lock`); fakepve refuses every lock.
            self._qm_lock(vm, None)
        unreferenced = str(v.get('destroy-unreferenced-disks', '0')) in ('1', 'true')
        offline = sorted(sid for sid, store in self.storages.items()
                         if not store.get('active', 1) and 'images' in str(store.get('content', 'images')))
        if not unreferenced or not offline:
            return await super()._qm_destroy(v, user)
        vm = self.find(v['node'], v['vmid'])
        self._qm_check_protection(vm, "can't remove VM {0}".format(vm.vmid))
        if vm.status == 'running':
            raise PveError(500, 'VM {0} is running - destroy failed'.format(vm.vmid))

        async def body():
            for _key, volume, _props in drives_of(vm.config):
                try:
                    self._qm_free(volume)
                except Exception:  # noqa: BLE001 - PVE only warns here
                    pass
            raise TaskError("storage '{0}' is not online".format(offline[0]))
        return await self.task(vm.node, 'qmdestroy', vm.vmid, user, body, vm=vm)

    # --- VM lifecycle conformance: an answer lost after the change was applied (a proxy timing out,
    # a connection reset), op `lose_answer` {method, suffix, times}. fakepve's `fail` refuses before
    # applying; on a real cluster the change is often made and only the answer is lost.
    lost_answers = None

    # qemu-server src/PVE/API2/Qemu.pm `update_vm` parses every netN through parse_net, which makes
    # up a MAC when none is given: a config update without MAC changes the NIC's MAC. fakepve keeps
    # the value as sent.
    #
    # The same `update_vm` allocates a new disk for every drive given in `<storage>:<GiB>` syntax
    # (its worker calls `create_disks`, after `check_storage_access` asked for
    # Datastore.AllocateSpace on the storage); a disk the slot held before becomes `unusedN`.
    # fakepve 0.5.0 stores `local-lvm:4` as the drive's value and allocates nothing.
    async def _apply_config(self, vm, user, p):
        for key in list(p):
            if key.startswith('net') and key[3:].isdigit() and p[key]:
                p[key] = with_mac(str(p[key]))
        made = []
        replaced = []
        try:
            for key in sorted(p):
                if not DRIVE_KEY.match(key) or not p[key]:
                    continue
                volume, props = split_drive(str(p[key]))
                found = NEW_DISK.match(volume)
                if not found or is_cdrom(volume, props):
                    continue
                self._qm_image_store(found.group(1) or '', user)
                p[key], volids = self._qm_new_drive(vm.vmid, key, str(p[key]), None)
                made.extend(volids)
                old = vm.config.get(key)
                if old and not is_cdrom(*split_drive(str(old))):
                    replaced.append(split_drive(str(old))[0])
            result = await super()._apply_config(vm, user, p)
        except BaseException:
            for volid in made:
                self._qm_free(volid)
            raise
        for volume in replaced:
            n = 0
            while 'unused{0}'.format(n) in vm.config:
                n += 1
            vm.config['unused{0}'.format(n)] = volume
        return result

    # --- A VMID taken on another node, for a clone. qemu-server src/PVE/API2/Qemu.pm `clone_vm`: the
    # early check (`$load_and_check`, before the worker forks) only tests `-f` on the config file in
    # the *source node's* directory, so a VMID held on another node passes it. The worker then writes
    # its temporary config with PVE::File `file_set_contents`, whose rename pmxcfs refuses with EEXIST
    # for a VMID another node holds (pve-cluster src/pmxcfs/memdb.c, memdb_rename:
    # `vmlist_different_vm_exists`): the *task* fails with "close (rename) atomic file ... failed:
    # File exists". fakepve refuses every taken VMID early with "config file already exists".
    async def _qm_clone(self, v, user):
        self._check_clone_source_shared(v)
        self._check_linked_clone_storage(v)
        newid, node = int(v['newid']), v['node']
        holder = self.vm(newid) or self.guest(newid)
        if holder is None or holder.node == node:
            return await super()._qm_clone(v, user)
        self._qm_check_pool(v.get('pool'))
        self._qm_perm(user, newid, v.get('pool'), 'VM.Allocate')
        self.need_quorum()
        self.find(node, int(v['vmid']))

        async def body():
            raise TaskError("close (rename) atomic file '/etc/pve/nodes/{0}/qemu-server/{1}.conf' failed: "
                            "File exists".format(node, newid))
        return await self.task(node, 'qmclone', int(v['vmid']), user, body, log=[
            'creating a clone of VM {0} with ID {1}'.format(v['vmid'], newid)])

    # Op `race_vmid` {suffix, node}: the next POST ending in `suffix` finds its VMID (`newid`, else
    # `vmid`) just taken by another client's VM on `node`, as between a caller's /cluster/nextid and
    # its create. With `name` and `config`, the VM taking it is that one (e.g. the caller's own earlier
    # create, applied late: `smbios1: from-request` gives it the SMBIOS UUID the create sends).
    vmid_races = None
    vmid_race_vms = None

    # --- Chaos runs (`make chaos`): a change that reaches Proxmox late, op `late_apply` {method,
    # suffix, secs}. The next matching request is held `secs` real seconds, then applied whether or
    # not its client is still there (killed, or gone after its own timeout), as a request stuck in a
    # proxy or in pveproxy's queue is applied by the API server once it gets through. `late_applies`
    # (op `late_held`) lists the held requests: {method, path, applied}.
    late_applies = None
    late_held = None

    async def _answer(self, request, handler, generic, path_node):
        for key, secs in list((self.late_applies or {}).items()):
            if request.method != key[0] or not request.path.endswith(key[1]):
                continue
            del self.late_applies[key]
            held = {'method': request.method, 'path': request.path, 'applied': False}
            self.late_held = (self.late_held or []) + [held]

            async def later():
                await asyncio.sleep(secs)
                try:
                    return await self._answer_now(request, handler, generic, path_node)
                finally:
                    held['applied'] = True
            # Shielded: a client that went away must not cancel the change.
            return await asyncio.shield(asyncio.ensure_future(later()))
        return await self._answer_now(request, handler, generic, path_node)

    # --- A cluster without quorum (op `quorum` {quorate}): /etc/pve is read-only. qemu-server
    # src/PVE/API2/Qemu.pm `create_vm`, `vm_start` and `clone_vm` call pve-cluster
    # src/PVE/Cluster.pm `check_cfs_quorum` first ("cluster not ready - no quorum?"); a write under
    # a cluster lock (pools in user.cfg, the HA domain) fails taking it (`$cfs_lock`: "cfs-lock
    # '<id>' error: no quorum!"). fakepve checks quorum for containers only. Reads still work.
    QUORUM_CHECKED = (('POST', '/nodes/{node}/qemu'), ('POST', '/nodes/{node}/qemu/{vmid}/status/start'),
                      ('POST', '/nodes/{node}/qemu/{vmid}/clone'))
    CFS_LOCKED = {'/pools': ('create pool failed', 'file-user_cfg'),
                  '/pools/{poolid}': ('update pools failed', 'file-user_cfg'),
                  '/cluster/ha/resources': ('create resource failed', 'domain-ha'),
                  '/cluster/ha/resources/{sid}': ('delete resource failed', 'domain-ha'),
                  '/cluster/ha/rules': ('create ha rule failed', 'domain-ha'),
                  '/cluster/ha/rules/{rule}': ('update HA rules failed', 'domain-ha')}

    def _quorum_refusal(self, request):
        if self.quorate or request.method == 'GET':
            return None
        segments = release_schema.api_segments(request)
        found = release_schema.match(release_schema.for_version(self.version), segments or [])
        if found is None:
            return None
        if (request.method, found.template) in self.QUORUM_CHECKED:
            return error(500, 'cluster not ready - no quorum?')
        if found.template in self.CFS_LOCKED:
            prefix, lock = self.CFS_LOCKED[found.template]
            return error(500, "{0}: cfs-lock '{1}' error: no quorum!".format(prefix, lock))
        return None

    async def _answer_now(self, request, handler, generic, path_node):
        refused = self._quorum_refusal(request)
        if refused is not None:
            return refused
        for suffix, node in list((self.vmid_races or {}).items()):
            if request.method == 'POST' and request.path.endswith(suffix):
                del self.vmid_races[suffix]
                p = await params(request)
                taken = int(p.get('newid') or p.get('vmid') or 0)
                if taken and not self._qm_taken(taken):
                    name, config = (self.vmid_race_vms or {}).pop(suffix, (None, None))
                    config = dict(config or {})
                    # The caller's own earlier create carries what this one sends: its SMBIOS UUID.
                    if config.get('smbios1') == 'from-request' and p.get('smbios1'):
                        config['smbios1'] = p['smbios1']
                    self.add_vm(taken, name or 'raced-{0}'.format(taken), node=node, config=config)
        response = await super()._answer(request, self._release_checked(handler), generic, path_node)
        for key, times in list((self.lost_answers or {}).items()):
            if request.method != key[0] or not request.path.endswith(key[1]) or response.status != 200:
                continue
            if times <= 1:
                del self.lost_answers[key]
            else:
                self.lost_answers[key] = times - 1
            return error(502, 'Bad Gateway (fakepve: the change was applied, its answer lost)')
        return response

    def _release_checked(self, handler):
        """`handler`, run only for a request the emulated release's own API schema accepts (see
        release_schema.py); fakepve's checks against its one PVE 9 schema follow."""
        schema = release_schema.for_version(self.version)

        async def checked(request):
            segments = release_schema.api_segments(request)
            # pveproxy reads an upload's multipart form itself, as fakepve does.
            if segments is not None and request.content_type != 'multipart/form-data':
                refused = release_schema.refusal(schema, request.method, segments, await params(request))
                if refused is not None:
                    raise refused
            return await handler(request)
        return checked

    def _qm_free(self, volid):
        """Real PVE never frees an ISO image through a VM (destroy skips CD-ROM drives); fakepve 0.5.0
        frees every drive's volume, which would make "the seed ISO was deleted" pass by itself."""
        sid, name = volume_ref(volid)
        vol = self.storages.get(sid, {}).get('volumes', {}).get(name) if sid else None
        if vol is not None and vol.get('content') in ('iso', 'vztmpl'):
            return
        super()._qm_free(volid)


class VmLog(list):
    """fakepve's VM list, remembering when each VM appeared and went (op `vm_lifetimes`), so a chaos
    run can prove that no request ever had two VMs at once, however briefly."""

    def __init__(self, vms):
        super().__init__()
        self.lifetimes = []
        self._open = {}
        for vm in vms:
            self.append(vm)

    def append(self, vm):
        super().append(vm)
        entry = {'vmid': vm.vmid, 'name': vm.name, 'from': time.monotonic(), 'to': None}
        self.lifetimes.append(entry)
        self._open[id(vm)] = (vm, entry)

    def remove(self, vm):
        super().remove(vm)
        kept = self._open.pop(id(vm), None)
        if kept is not None:
            kept[1]['to'] = time.monotonic()


def agent_enabled(config):
    value = str(config.get('agent', '0'))
    first = value.split(',')[0]
    return first in ('1', 'enabled=1') or 'enabled=1' in value


def default_interfaces(vmid):
    """Loopback, a link-local IPv6 and one IPv4 derived from the VMID, like a DHCP lease."""
    ip = '10.99.{0}.{1}'.format((vmid // 250) % 250, vmid % 250 + 2)
    return [
        {'name': 'lo', 'hardware-address': '00:00:00:00:00:00',
         'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8},
                          {'ip-address': '::1', 'ip-address-type': 'ipv6', 'prefix': 128}]},
        {'name': 'eth0', 'hardware-address': 'bc:24:11:00:{0:02x}:{1:02x}'.format((vmid >> 8) & 255, vmid & 255),
         'ip-addresses': [{'ip-address': 'fe80::be24:11ff:fe00:1', 'ip-address-type': 'ipv6', 'prefix': 64},
                          {'ip-address': ip, 'ip-address-type': 'ipv4', 'prefix': 24}]},
    ]


def network_config_of(iso):
    """The `network-config` file inside a seed ISO our provider built: files are stored verbatim, each
    from the start of its own sector, padded with zeros."""
    start = iso.find(b'version: 1\n')
    if start < 0:
        return None
    end = iso.find(b'\x00', start)
    return iso[start:end if end >= 0 else len(iso)].decode()


def static_addresses(network_config):
    """MAC (lowercase) -> ["address/prefix"] of the static subnets of a network-config v1, read the
    way our provider writes it (one key per line, values JSON-quoted)."""
    out, mac = {}, None
    for line in network_config.splitlines():
        text = line.strip()
        if text.startswith('- type: physical'):
            mac = None
        elif text.startswith('mac_address:'):
            mac = json.loads(text.split(':', 1)[1].strip()).lower()
        elif text.startswith('address:') and mac is not None and '/' in text:
            out.setdefault(mac, []).append(json.loads(text.split(':', 1)[1].strip()))
    return out


def build(scenario):
    pve = LauncherPve(user=scenario.get('user', 'root@pam'), password=scenario.get('password', 'secret'),
                      host=scenario.get('host', '127.0.0.1'), port=scenario.get('port', 0))
    pve.time_scale = float(scenario.get('time_scale', 0))
    pve.standalone = bool(scenario.get('standalone', False))
    if 'cluster_name' in scenario:
        pve.cluster_name = scenario['cluster_name']
    pve.agent_default = bool(scenario.get('agent_default', False))
    for node in scenario.get('nodes', []):
        pve.add_node(node['name'], online=node.get('online', True))
        size = dict((k, node[k]) for k in ('maxcpu', 'maxmem') if k in node)
        if size:
            pve.node_sizes = dict(pve.node_sizes or {}, **{node['name']: size})
    for guest in scenario.get('guests', []):
        vm = pve.add_vm(guest['vmid'], guest['name'], node=guest.get('node', 'pve1'),
                        status=guest.get('status', 'stopped'), config=guest.get('config', {}),
                        template=guest.get('template', False), lock=guest.get('lock'))
        for key in ('shutdown_secs', 'start_secs', 'stop_secs', 'start_error', 'agent', 'acpi'):
            if key in guest:
                setattr(vm, key, guest[key])
    pve.vms = VmLog(pve.vms)
    if 'bridges' in scenario:
        pve.bridges = dict(scenario['bridges'])
    if 'mappings' in scenario:
        pve.mappings = dict(scenario['mappings'])
    for tokenid, secret in scenario.get('tokens', {}).items():
        pve.apitokens[tokenid] = secret
    build_timing(pve, scenario)
    build_client_conformance(pve, scenario)
    for name, options in scenario.get('storages', {}).items():
        store = pve.storages.setdefault(name, {'files': set(), 'active': 1})
        store.setdefault('files', set())
        store.update(options)
        if 'avail' in options or 'total' in options:
            pve.sized_storages += (name,)
    return pve


def build_timing(pve, scenario):
    """Scenario keys for the benchmark: `latency` (PVE seconds added to every answer), `node_latency`
    ({node: PVE seconds} added to the answers about that node: requests whose path names it),
    `task_secs` ({task type: PVE seconds}, see LauncherPve.task), `download_secs` (an ISO download's
    duration, 5 by default) and `max_requests` (how many requests the `requests` op remembers;
    fakepve keeps the last 10000). Like every fakepve time, the
    latencies are scaled by `time_scale`: at 0 they vanish, at 1 they are real seconds."""
    if 'latency' in scenario:
        pve.slow_network(float(scenario['latency']))
    for node, secs in scenario.get('node_latency', {}).items():
        pve.slow_network(float(secs), node=node)
    if 'task_secs' in scenario:
        pve.task_secs = dict(scenario['task_secs'])
    if 'max_requests' in scenario:
        pve.max_requests = int(scenario['max_requests'])
    if 'download_secs' in scenario:
        pve.download_secs = float(scenario['download_secs'])


def build_client_conformance(pve, scenario):
    """Scenario keys for the Proxmox client's conformance: `acl` ({user or token: [[path, [privs]]]}, after
    which only granted privileges hold), `old_pve8_errors`, `pve_version` ("8.0.4"), `next_id`
    ([lower, upper]), `user_tag_access` ({"user-allow": ..., "user-allow-list": [...]}), `registered_tags`."""
    for who, entries in scenario.get('acl', {}).items():
        for path, privs in entries:
            pve.grant(who, path, *privs)
    pve.old_pve8_errors = bool(scenario.get('old_pve8_errors', False))
    pve.ha_purges = bool(scenario.get('ha_purge', True))
    if 'pve_version' in scenario:
        pve.version = scenario['pve_version']
        pve.release_version = '.'.join(scenario['pve_version'].split('.')[:2])
    if 'next_id' in scenario:
        pve.next_id_range = tuple(scenario['next_id'])
    if 'user_tag_access' in scenario:
        pve.user_tag_access = dict(scenario['user_tag_access'])
    pve.registered_tags = tuple(scenario.get('registered_tags', ()))


async def client_conformance_command(pve, cmd):
    """Ops for the Proxmox client's conformance: `grant` (who, path, privs), `set_acl` (who, entries),
    `old_pve8_errors` (on), `unlist_volume` (volid)."""
    op = cmd.get('op')
    if op == 'grant':
        pve.grant(cmd['who'], cmd['path'], *cmd['privs'])
    elif op == 'set_acl':
        # Replaces what `who` holds: entries [[path, [privs]]].
        pve.grant(cmd['who'], '/')
        pve.acl[cmd['who']] = [(path.rstrip('/') or '/', set(privs)) for path, privs in cmd['entries']]
    elif op == 'old_pve8_errors':
        pve.old_pve8_errors = bool(cmd.get('on', True))
    elif op == 'delete_volume':
        # As an operator deleting a file in the storage's directory: no checks, no task.
        sid, name = volume_ref(cmd['volid'])
        store = pve.storages[sid]
        store.get('volumes', {}).pop(name, None)
        if name.startswith('iso/'):
            store.get('files', set()).discard(name[4:])
    elif op == 'unlist_volume':
        pve.unlisted_volumes = tuple(pve.unlisted_volumes) + (cmd['volid'],)
    else:
        raise ValueError('unknown op {0!r}'.format(op))
    return None


def vm_view(vm):
    return {'vmid': vm.vmid, 'name': vm.name, 'node': vm.node, 'status': vm.status, 'template': bool(vm.template),
            'lock': vm.lock, 'pool': vm.pool, 'config': dict(vm.config)}


async def command(pve, cmd):
    op = cmd.get('op')
    if op == 'set_node_offline':
        pve.set_node_offline(cmd['node'], cmd.get('offline', True))
    elif op == 'revoke_tickets':
        pve.revoke_tickets()
    elif op == 'ticket_ttl':
        pve.ticket_ttl = cmd['seconds']
    elif op == 'migrate':
        return await pve.migrate(cmd['vmid'], cmd['target'], secs=0)
    elif op == 'fail':
        pve.fail(cmd['method'], cmd['suffix'], status=cmd.get('status'), message=cmd.get('message'),
                 error=cmd.get('error'), times=cmd.get('times'))
    elif op == 'clear_failures':
        pve.failures.clear()
    elif op == 'requests':
        return [[m, p] for (m, p, *_rest) in pve.requests]
    elif op == 'reset_requests':
        pve.requests.clear()
    elif op == 'vm':
        vm = pve.guest(cmd['vmid'])
        return vm_view(vm) if vm is not None else None
    elif op == 'vms':
        return [vm_view(vm) for vm in pve.vms]
    elif op == 'upload_size':
        # How many bytes the last upload into volume `volid` carried (None: none arrived).
        data = (pve.uploads or {}).get(cmd['volid'])
        return len(data) if data is not None else None
    elif op == 'seed_network_config':
        # The network-config of the seed attached to VM `vmid`, as its guest would read it.
        vm = pve.guest(cmd['vmid'])
        return pve.seed_network_config(vm) if vm is not None else None
    elif op == 'add_vm':
        vm = pve.add_vm(cmd['vmid'], cmd['name'], node=cmd.get('node', 'pve1'), status=cmd.get('status', 'stopped'),
                        config=cmd.get('config', {}), template=cmd.get('template', False))
        if cmd.get('pool'):
            pve._pool_join(cmd['pool'], vm.vmid)
        return vm_view(vm)
    elif op == 'set_vm':
        # Rewrites a VM's config and lock in place, e.g. to show it the way qemu-server's create does
        # while its worker runs: src/PVE/API2/Qemu.pm `create_vm` calls `create_and_lock_config`
        # (a config holding only `lock: create`) before forking the worker, which writes the full
        # config only after every disk is allocated.
        vm = pve.guest(cmd['vmid'])
        if 'config' in cmd:
            vm.config = dict(cmd['config'])
        if 'lock' in cmd:
            pve._qm_lock(vm, cmd['lock'])
        return vm_view(vm)
    elif op == 'remove_vm':
        for vm in [vm for vm in pve.vms if vm.vmid == cmd['vmid']]:
            pve.vms.remove(vm)
    elif op == 'set_agent':
        pve.guest(cmd['vmid']).agent = {'interfaces': cmd['interfaces']} if cmd.get('interfaces') is not None else None
    elif op == 'storage_volumes':
        store = pve.storages[cmd['storage']]
        return sorted(store.get('volumes', {}).keys())
    elif op == 'set_storage':
        pve.storages.setdefault(cmd['name'], {'files': set(), 'active': 1}).update(cmd['options'])
    elif op == 'set_bridges':
        pve.bridges = dict(pve.bridges or {}, **{cmd['node']: cmd['bridges']})
    elif op == 'set_mappings':
        pve.mappings = dict(pve.mappings or {}, **{cmd['kind']: cmd['mappings']})
    elif op == 'pools':
        return dict((name, sorted(members)) for name, members in pve.pools.items())
    elif op == 'listing_without_stats':
        # The listing shows these VMs (a `vmid`) or every VM of a `node` as pvestatd-less entries until
        # called again with on=false.
        attr = 'stats_missing_vmids' if 'vmid' in cmd else 'stats_missing_nodes'
        key = cmd['vmid'] if 'vmid' in cmd else cmd['node']
        current = set(getattr(pve, attr) or ())
        if cmd.get('on', True):
            current.add(key)
        else:
            current.discard(key)
        setattr(pve, attr, current)
    elif op == 'lose_answer':
        lost = dict(pve.lost_answers or {})
        lost[(cmd['method'], cmd['suffix'])] = int(cmd.get('times', 1))
        pve.lost_answers = lost
    elif op == 'late_apply':
        pve.late_applies = dict(pve.late_applies or {})
        pve.late_applies[(cmd['method'], cmd['suffix'])] = float(cmd['secs'])
    elif op == 'late_held':
        return list(pve.late_held or [])
    elif op == 'quorum':
        pve.quorate = bool(cmd['quorate'])
    elif op == 'network':
        # fakepve's network knobs (server.py `_middleware`): latency and jitter (PVE seconds, scaled
        # by time_scale) on every request, and the share of requests whose connection is reset
        # before they are applied (drop_rate) or held hang_secs first (hang_rate). Keys not given
        # keep their value; `seed` makes the randomness repeatable.
        for key in ('latency', 'jitter', 'drop_rate', 'hang_rate', 'hang_secs'):
            if key in cmd:
                pve.network[key] = float(cmd[key])
        if cmd.get('seed') is not None:
            pve._random.seed(cmd['seed'])
        return dict((k, v) for k, v in pve.network.items() if k != 'node_latency')
    elif op == 'vm_lifetimes':
        # Every VM that existed since start: {vmid, name, from, to} (monotonic seconds; `to` null
        # while it exists), and `now` to compare with.
        return {'now': time.monotonic(), 'vms': list(pve.vms.lifetimes)}
    elif op == 'race_vmid':
        pve.vmid_races = dict(pve.vmid_races or {}, **{cmd['suffix']: cmd['node']})
        if 'name' in cmd:
            pve.vmid_race_vms = dict(pve.vmid_race_vms or {}, **{cmd['suffix']: (cmd['name'], cmd.get('config'))})
    elif op == 'listing_status':
        # The listing shows `status` for `vmid` (pvestatd's stale view) until called with status null.
        stale = dict(pve.stats_stale_status or {})
        if cmd.get('status') is None:
            stale.pop(cmd['vmid'], None)
        else:
            stale[cmd['vmid']] = cmd['status']
        pve.stats_stale_status = stale
    elif op == 'stats_lag':
        # A VM's first `seconds` in the listing (from the first listing that shows it) go without stats.
        pve.stats_lag_secs = float(cmd['seconds'])
        pve._stats_first_seen = {vm.vmid: time.monotonic() - 1e9 for vm in pve.vms}
    elif op == 'ha_rules':
        pve._ha_rules_settle()
        return dict((name, pve._ha_rule_view(name, rule)) for name, rule in (pve.ha_rules or {}).items())
    elif op == 'ha_resources':
        return sorted('vm:{0}'.format(vm.vmid) for vm in pve.vms if vm.ha_managed)
    elif op == 'ha_groups':
        pve.ha_groups = list(cmd.get('names') or [])
    elif op == 'ha_manage':
        pve.guest(cmd['vmid']).ha_state = cmd.get('state', 'started')
    elif op == 'ha_add_rule':
        # As an operator would make it, without the API's checks (e.g. a rule with one resource).
        pve.ha_rules = pve.ha_rules if pve.ha_rules is not None else {}
        rule = {'type': cmd['type'], 'resources': set(cmd['resources']), 'order': len(pve.ha_rules) + 1}
        rule.update((k, cmd[k]) for k in ('affinity', 'nodes', 'comment') if k in cmd)
        pve.ha_rules[cmd['rule']] = rule
        pve._ha_rules_write()
    elif op == 'slow_network':
        # {latency, node?}: PVE seconds added to every answer, or to one node's (0 ends it).
        pve.slow_network(float(cmd['latency']), node=cmd.get('node'))
    elif op == 'task_secs':
        # {type, secs}: see LauncherPve.task.
        pve.task_secs = dict(pve.task_secs or {}, **{cmd['type']: float(cmd['secs'])})
    elif op == 'writes':
        return [list(w) for w in (pve.writes or [])]
    elif op == 'request_count':
        # How many requests fakepve has recorded since the last reset, without sending them all.
        return len(pve.requests)
    elif op == 'ping':
        return 'pong'
    elif op in ('grant', 'set_acl', 'old_pve8_errors', 'unlist_volume', 'delete_volume'):
        return await client_conformance_command(pve, cmd)
    else:
        raise ValueError('unknown op {0!r}'.format(op))
    return None


class QuietResets(logging.Filter):
    """aiohttp logs a traceback for every connection reset: the ones the `network` op makes, and
    every client killed mid-request. They are the point of those tests, not errors."""

    def filter(self, record):
        error = record.exc_info[1] if record.exc_info else None
        # fakepve's drop closes a transport a killed client already took away.
        gone = isinstance(error, AttributeError) and "'close'" in str(error)
        return not (isinstance(error, ConnectionResetError) or gone)


async def main():
    logging.getLogger('aiohttp.server').addFilter(QuietResets())
    with open(sys.argv[1]) as f:
        scenario = json.load(f)
    pve = build(scenario)
    await pve.start(scenario['cert'], scenario['key'])
    print('fakepve listening on {0}'.format(pve.url), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        try:
            result = await command(pve, json.loads(line))
            answer = {'ok': True, 'result': result}
        except (PveError, Exception) as e:  # noqa: BLE001 - every failure goes back to the test
            answer = {'ok': False, 'error': '{0}: {1}'.format(type(e).__name__, e)}
        print(json.dumps(answer, default=str), flush=True)
    await pve.stop()


if __name__ == '__main__':
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
