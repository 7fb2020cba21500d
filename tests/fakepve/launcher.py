# SPDX-License-Identifier: AGPL-3.0-or-later
#
# Test-only launcher for fakepve (AGPL), used by our integration tests and the demo. It is run as a
# separate process and never ships with the provider; nothing in the Rust crate links to it.
#
# It does what the fakepve CLI cannot: register API tokens, add nodes without guests, configure
# storages, give VMs created through the API a guest agent (so IP discovery can be tested), and take
# control commands while running (node offline, migrations, injected failures, request counts), and
# answer the node network list and the PCI/USB resource mappings from the scenario (`bridges`,
# `mappings`; ops `set_bridges`, `set_mappings`).
#
# Usage: python launcher.py SCENARIO.json
#   prints "fakepve listening on https://HOST:PORT" once ready, then reads one JSON command per line on
#   stdin and answers one JSON line on stdout: {"ok": true, "result": ...} or {"ok": false, "error": "..."}.
#   EOF on stdin stops the server.

import asyncio
import json
import re
import sys

from aiohttp import web
from fakepve.model import PveError, TaskError
from fakepve.qemu import volume_ref
from fakepve.routing import die, split_list
from fakepve.server import GENERIC, USER, FakePve, int_param, ok, params


class LauncherPve(FakePve):
    """FakePve whose VMs with `agent: 1` in their config answer guest-agent calls once running."""

    agent_default = False
    # Node name -> bridge names, answered by GET /nodes/{node}/network (nodes not listed get fakepve's
    # generic answer: vmbr0 only). Kind -> mappings, answered by GET /cluster/mapping/{pci,usb}.
    bridges = None
    mappings = None

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
        if (request.method == 'GET' and match is not None and match.template == '/nodes/{node}/network'
                and request.query.get('type') == 'include_sdn' and self._pve_before(9)):
            # pve-manager Network.pm: the `include_sdn` type filter is PVE 9's.
            raise PveError(400, 'Parameter verification failed.',
                           {'type': "value 'include_sdn' does not have a value in the enumeration 'bridge, bond, "
                                    "eth, alias, vlan, OVSBridge, OVSBond, OVSPort, OVSIntPort, any_bridge'"})
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
        return await super()._generic(request)

    async def _agent_call(self, match, values):
        vm = self.find(values['node'], values['vmid'])
        if self.agent_default and vm is not None and vm.agent is None and agent_enabled(vm.config):
            vm.agent = {'interfaces': default_interfaces(vm.vmid)}
        return await super()._agent_call(match, values)

    # ---- Proxmox client conformance (old PVE 8 errors, next-id range, download-url as PVE does it) ----

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
        exists = '{0}/{1}'.format(content, filename) in store.get('volumes', {})

        async def body():
            await self.pause(5)
            if exists:
                if p.get('checksum'):
                    return
                raise TaskError("refusing to override existing file '{0}/template/{1}/{2}'".format(
                    self._storage_path(name), content, filename))
            self.store_file(name, filename, size, content)
        return ok(await self.task(node, 'download', name, user, body,
                                  log=['downloading {0} to {1}'.format(p.get('url'), filename)]))

    async def _qm_create(self, v, user):
        """qemu-server's create_vm checks SDN.Use on every bridge (QemuServer::check_bridge_access, the
        local bridges under /sdn/zones/localnetwork/); fakepve 0.5.0 does so only for containers."""
        for key in sorted(v):
            if re.fullmatch(r'net\d+', key) and v[key]:
                self._check_bridge(user, v[key])
        self._check_tags(user, v.get('tags'))
        return await super()._qm_create(v, user)

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

    def _qm_free(self, volid):
        """Real PVE never frees an ISO image through a VM (destroy skips CD-ROM drives); fakepve 0.5.0
        frees every drive's volume, which would make "the seed ISO was deleted" pass by itself."""
        sid, name = volume_ref(volid)
        vol = self.storages.get(sid, {}).get('volumes', {}).get(name) if sid else None
        if vol is not None and vol.get('content') in ('iso', 'vztmpl'):
            return
        super()._qm_free(volid)


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


def build(scenario):
    pve = LauncherPve(user=scenario.get('user', 'root@pam'), password=scenario.get('password', 'secret'),
                      host=scenario.get('host', '127.0.0.1'), port=scenario.get('port', 0))
    pve.time_scale = float(scenario.get('time_scale', 0))
    pve.agent_default = bool(scenario.get('agent_default', False))
    for node in scenario.get('nodes', []):
        pve.add_node(node['name'], online=node.get('online', True))
    for guest in scenario.get('guests', []):
        vm = pve.add_vm(guest['vmid'], guest['name'], node=guest.get('node', 'pve1'),
                        status=guest.get('status', 'stopped'), config=guest.get('config', {}),
                        template=guest.get('template', False), lock=guest.get('lock'))
        for key in ('shutdown_secs', 'start_secs', 'stop_secs', 'start_error', 'agent', 'acpi'):
            if key in guest:
                setattr(vm, key, guest[key])
    if 'bridges' in scenario:
        pve.bridges = dict(scenario['bridges'])
    if 'mappings' in scenario:
        pve.mappings = dict(scenario['mappings'])
    for tokenid, secret in scenario.get('tokens', {}).items():
        pve.apitokens[tokenid] = secret
    build_client_conformance(pve, scenario)
    for name, options in scenario.get('storages', {}).items():
        store = pve.storages.setdefault(name, {'files': set(), 'active': 1})
        store.setdefault('files', set())
        store.update(options)
    return pve


def build_client_conformance(pve, scenario):
    """Scenario keys for the Proxmox client's conformance: `acl` ({user or token: [[path, [privs]]]}, after
    which only granted privileges hold), `old_pve8_errors`, `pve_version` ("8.0.4"), `next_id`
    ([lower, upper]), `user_tag_access` ({"user-allow": ..., "user-allow-list": [...]}), `registered_tags`."""
    for who, entries in scenario.get('acl', {}).items():
        for path, privs in entries:
            pve.grant(who, path, *privs)
    pve.old_pve8_errors = bool(scenario.get('old_pve8_errors', False))
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
    elif op == 'add_vm':
        vm = pve.add_vm(cmd['vmid'], cmd['name'], node=cmd.get('node', 'pve1'), status=cmd.get('status', 'stopped'),
                        config=cmd.get('config', {}))
        return vm_view(vm)
    elif op == 'remove_vm':
        pve.vms = [vm for vm in pve.vms if vm.vmid != cmd['vmid']]
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
    elif op == 'ping':
        return 'pong'
    elif op in ('grant', 'set_acl', 'old_pve8_errors', 'unlist_volume'):
        return await client_conformance_command(pve, cmd)
    else:
        raise ValueError('unknown op {0!r}'.format(op))
    return None


async def main():
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
