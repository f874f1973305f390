--[[ reshard's job_submit/lua hook (docs/slurm.md, "Shrinking"): an admin's
shrink of a running elastic job becomes a request that `reshard slurm watch`
carries out, so that the job's state moves off the released nodes before
Slurm releases them.

  scontrol update JobId=J NumNodes=N      -> Comment "reshard:<mark> shrink:N"
  scontrol update JobId=J NodeList=LIST   -> Comment "reshard:<mark> keep:LIST"

The job keeps its nodes; the adapter gives the nodes that go host notices,
waits until the job no longer uses them, and then updates the job itself,
with AdminComment=reshard-moved-off, which this hook lets through. A job
that holds no reshard job (its Comment is not "reshard:<job id>:<proof>"),
or that is not running, is left alone.

Install: JobSubmitPlugins=lua in slurm.conf, this file as job_submit.lua in
slurm.conf's directory (or merged into the site's own job_submit.lua). ]]

local TAG = "reshard:"
local MOVED = "reshard-moved-off"
local JOB_RUNNING = 1

function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local comment = job_rec.comment
  local job = comment and string.match(comment, "^reshard:(%S+)")
  -- The state's base (its low byte) without flags such as RESIZING.
  if job == nil or (job_rec.job_state or 0) % 256 ~= JOB_RUNNING or
      job_desc.admin_comment == MOVED then
    return slurm.SUCCESS
  end
  local n = job_desc.min_nodes
  if n ~= nil and n ~= slurm.NO_VAL then
    job_desc.min_nodes = slurm.NO_VAL
    job_desc.comment = TAG .. job .. " shrink:" .. n
    slurm.log_info("reshard: JobId=%u NumNodes=%u becomes a request: reshard slurm watch "
                   .. "moves job %s off the nodes that go, then shrinks it", job_rec.job_id, n, job)
  elseif job_desc.req_nodes ~= nil then
    local keep = job_desc.req_nodes
    job_desc.req_nodes = ""  -- no NodeList update (an empty value clears it)
    job_desc.comment = TAG .. job .. " keep:" .. keep
    slurm.log_info("reshard: JobId=%u NodeList=%s becomes a request: reshard slurm watch "
                   .. "moves job %s off the nodes that go, then shrinks it", job_rec.job_id, keep,
                   job)
  end
  return slurm.SUCCESS
end
